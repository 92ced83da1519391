//! Bytes across the boundary: the writer callbacks fill (`microrep_bytes`), the buffers the
//! library hands out (`microrep_buffer`), and the checks on the caller's pointers.

use std::ffi::{CStr, c_char};
use std::mem::ManuallyDrop;

use crate::error::Error;

/// Where a callback writes its reply or snapshot: append with `microrep_bytes_append`. Valid
/// only during the callback it is passed to.
#[allow(non_camel_case_types)]
#[derive(Debug, Default)]
pub struct microrep_bytes {
    vec: Vec<u8>,
}

impl microrep_bytes {
    /// Lends `vec` to a callback as a writer: `call` gets the writer's pointer, and what it
    /// appended lands in `vec`.
    pub(crate) fn lend<R>(vec: &mut Vec<u8>, call: impl FnOnce(*mut Self) -> R) -> R {
        let mut writer = Self { vec: std::mem::take(vec) };
        let result = call(&mut writer);
        *vec = writer.vec;
        result
    }
}

/// Appends `len` bytes at `data` to `bytes`. Returns false (and appends nothing) if `bytes` is
/// null, or `data` is null while `len` is not 0.
///
/// # Safety
/// `bytes` is the writer passed to the running callback; `data` points to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_bytes_append(bytes: *mut microrep_bytes, data: *const u8, len: usize) -> bool {
    // SAFETY: the caller passes the writer of the running callback (or null, refused here),
    // which nothing else touches during the callback.
    let Some(bytes) = (unsafe { bytes.as_mut() }) else { return false };
    // SAFETY: forwarded from the caller's contract on `data` and `len`.
    match unsafe { slice_arg(data, len, "data") } {
        Ok(slice) => {
            bytes.vec.extend_from_slice(slice);
            true
        }
        Err(_) => false,
    }
}

/// Bytes the library allocated for the caller (a reply, a status document). Release them with
/// `microrep_buffer_free`. `data[len]` is 0 where a function says the buffer is text.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug)]
pub struct microrep_buffer {
    /// The bytes (never null once filled by the library).
    pub data: *mut u8,
    /// How many.
    pub len: usize,
    /// Owned by the library: pass the buffer back unchanged.
    pub capacity: usize,
}

impl microrep_buffer {
    /// A buffer with nothing to free.
    pub(crate) const EMPTY: Self = Self { data: std::ptr::null_mut(), len: 0, capacity: 0 };

    /// Hands `vec` to the caller.
    pub(crate) fn from_vec(vec: Vec<u8>) -> Self {
        let mut vec = ManuallyDrop::new(vec);
        Self { data: vec.as_mut_ptr(), len: vec.len(), capacity: vec.capacity() }
    }

    /// Hands `text` to the caller with a terminating NUL after `len` bytes.
    pub(crate) fn from_text(text: String) -> Self {
        let mut vec = text.into_bytes();
        vec.push(0);
        let mut buffer = Self::from_vec(vec);
        buffer.len -= 1;
        buffer
    }
}

/// Frees what `buffer` holds and empties it (freeing an empty buffer does nothing).
///
/// # Safety
/// `buffer` is null or points to a buffer filled by this library and not modified since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn microrep_buffer_free(buffer: *mut microrep_buffer) {
    // SAFETY: the caller passes null or a valid buffer.
    let Some(buffer) = (unsafe { buffer.as_mut() }) else { return };
    if !buffer.data.is_null() {
        // SAFETY: data, len and capacity come from a `Vec<u8>` leaked by `from_vec`, unchanged
        // (the caller's contract), and the buffer is emptied below so this runs once.
        drop(unsafe { Vec::from_raw_parts(buffer.data, buffer.len, buffer.capacity) });
    }
    *buffer = microrep_buffer::EMPTY;
}

/// The caller's `len` bytes at `data` (null is allowed when `len` is 0).
///
/// # Safety
/// Unless null, `data` points to `len` readable bytes that live for `'a`.
pub(crate) unsafe fn slice_arg<'a>(data: *const u8, len: usize, what: &str) -> Result<&'a [u8], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(Error::invalid(format!("{what} is null but its length is {len}")));
    }
    // SAFETY: non-null, and the caller's contract says it points to `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(data, len) })
}

/// The caller's NUL-terminated UTF-8 string.
///
/// # Safety
/// Unless null, `s` points to a NUL-terminated string that lives for `'a`.
pub(crate) unsafe fn str_arg<'a>(s: *const c_char, what: &str) -> Result<&'a str, Error> {
    if s.is_null() {
        return Err(Error::invalid(format!("{what} is null")));
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str().map_err(|_| Error::invalid(format!("{what} is not UTF-8")))
}

/// Writes `value` through the caller's out-pointer.
///
/// # Safety
/// Unless null, `out` points to writable memory for a `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T, what: &str) -> Result<(), Error> {
    if out.is_null() {
        return Err(Error::invalid(format!("{what} is null")));
    }
    // SAFETY: non-null and writable by the caller's contract; `write` drops nothing there.
    unsafe { out.write(value) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_appends_to_its_vec() {
        let mut vec = b"ab".to_vec();
        let appended = microrep_bytes::lend(&mut vec, |w| {
            // SAFETY: `w` is the live writer; the data pointers are valid for their lengths.
            unsafe {
                [
                    microrep_bytes_append(w, b"cd".as_ptr(), 2),
                    microrep_bytes_append(w, std::ptr::null(), 0),
                    microrep_bytes_append(w, std::ptr::null(), 3),
                    microrep_bytes_append(std::ptr::null_mut(), b"x".as_ptr(), 1),
                ]
            }
        });
        assert_eq!(appended, [true, true, false, false]);
        assert_eq!(vec, b"abcd");
    }

    #[test]
    fn buffers_round_trip_and_free_once() {
        let mut b = microrep_buffer::from_text("{}".into());
        assert_eq!(b.len, 2);
        // SAFETY: from_text leaves a NUL at data[len], inside the allocation.
        assert_eq!(unsafe { *b.data.add(b.len) }, 0);
        // SAFETY: `b` was filled by from_text; freeing twice frees once (it is emptied).
        unsafe {
            microrep_buffer_free(&mut b);
            microrep_buffer_free(&mut b);
            microrep_buffer_free(std::ptr::null_mut());
        }
        assert!(b.data.is_null() && b.len == 0);
    }

    #[test]
    fn null_arguments_are_refused_with_their_name() {
        // SAFETY: null pointers are checked before any read or write.
        unsafe {
            assert_eq!(slice_arg(std::ptr::null(), 0, "command").map(<[u8]>::len).ok(), Some(0));
            let e = slice_arg(std::ptr::null(), 4, "command").expect_err("null");
            assert_eq!(e.message, "command is null but its length is 4");
            assert_eq!(str_arg(std::ptr::null(), "path").expect_err("null").message, "path is null");
            assert_eq!(str_arg(c"\xff".as_ptr(), "path").expect_err("utf8").message, "path is not UTF-8");
            assert!(write_out(std::ptr::null_mut::<u8>(), 1, "out").is_err());
        }
    }
}
