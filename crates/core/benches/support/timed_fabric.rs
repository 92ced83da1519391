//! A fabric that times what a replica asks of the one it wraps: every post (how long the call
//! took, what it posted, to whom), every completion (when the poll that returned it began), and
//! the polls that found nothing (counted and timed, not listed). Used to break a commit down into
//! its steps (`commit_breakdown`); recording is off until the caller turns it on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use microrep_fabric::{
    Completion, Endpoint, EndpointState, Fabric, FabricError, NodeId, OpKind, PostFlags, RegionId, RemoteAddr,
    RevokePath,
};

/// What one call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    Write { len: u32, signaled: bool },
    Read { len: u32, signaled: bool },
    Completion { kind: OpKind, ok: bool },
}

/// One recorded call: `at` is when it began, `took` how long it ran (ns on the trace's clock).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Event {
    pub(crate) at: u64,
    pub(crate) took: u64,
    pub(crate) peer: NodeId,
    pub(crate) wr_id: u64,
    pub(crate) what: What,
}

/// What was recorded since the last [`Trace::take`].
#[derive(Debug, Default)]
pub(crate) struct Recorded {
    pub(crate) events: Vec<Event>,
    pub(crate) empty_polls: u64,
    pub(crate) empty_poll_ns: u64,
}

/// The shared record and its clock.
#[derive(Clone, Debug)]
pub(crate) struct Trace {
    start: Instant,
    /// Whether recording is on: checked before the clock is read, so that a trace that is off
    /// costs one load per call.
    enabled: Arc<AtomicBool>,
    on: Arc<Mutex<Option<Recorded>>>,
}

impl Trace {
    pub(crate) fn new(start: Instant) -> Self {
        Self { start, enabled: Arc::default(), on: Arc::new(Mutex::new(None)) }
    }

    /// Nanoseconds since the trace's start (the clock the replica is given too).
    pub(crate) fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Starts recording afresh.
    pub(crate) fn begin(&self) {
        *self.lock() = Some(Recorded::default());
        self.enabled.store(true, Ordering::Relaxed);
    }

    fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Stops recording and returns what was recorded.
    pub(crate) fn take(&self) -> Recorded {
        self.enabled.store(false, Ordering::Relaxed);
        self.lock().take().unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Recorded>> {
        self.on.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, event: Event) {
        if let Some(r) = self.lock().as_mut() {
            r.events.push(event);
        }
    }

    fn empty_poll(&self, took: u64) {
        if let Some(r) = self.lock().as_mut() {
            r.empty_polls += 1;
            r.empty_poll_ns += took;
        }
    }
}

/// `F` with its endpoints' calls recorded in a [`Trace`].
pub(crate) struct TimedFabric<F> {
    inner: F,
    trace: Trace,
}

impl<F> TimedFabric<F> {
    pub(crate) fn new(inner: F, trace: Trace) -> Self {
        Self { inner, trace }
    }
}

pub(crate) struct TimedEndpoint<E> {
    inner: E,
    trace: Trace,
}

impl<F: Fabric> Fabric for TimedFabric<F> {
    type Endpoint = TimedEndpoint<F::Endpoint>;

    fn node_id(&self) -> NodeId {
        self.inner.node_id()
    }
    fn connect(&self, peer: NodeId) -> Result<Self::Endpoint, FabricError> {
        Ok(TimedEndpoint { inner: self.inner.connect(peer)?, trace: self.trace.clone() })
    }
    fn try_connect(&self, peer: NodeId) -> Result<Option<Self::Endpoint>, FabricError> {
        let trace = &self.trace;
        Ok(self.inner.try_connect(peer)?.map(|inner| TimedEndpoint { inner, trace: trace.clone() }))
    }
    fn grant_write(&self, region: RegionId, peer: NodeId) -> Result<(), FabricError> {
        self.inner.grant_write(region, peer)
    }
    fn revoke_write(&self, region: RegionId, peer: NodeId) -> Result<RevokePath, FabricError> {
        self.inner.revoke_write(region, peer)
    }
    fn region_len(&self, region: RegionId) -> Result<u64, FabricError> {
        self.inner.region_len(region)
    }
    fn read_local(&self, region: RegionId, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        self.inner.read_local(region, offset, buf)
    }
    unsafe fn local_bytes(
        &self,
        region: RegionId,
        offset: u64,
        len: usize,
    ) -> Result<std::borrow::Cow<'_, [u8]>, FabricError> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.local_bytes(region, offset, len) }
    }
    fn lends_local_bytes(&self) -> bool {
        self.inner.lends_local_bytes()
    }
    fn write_local(&self, region: RegionId, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        self.inner.write_local(region, offset, data)
    }
    fn load_u64(&self, region: RegionId, offset: u64) -> Result<u64, FabricError> {
        self.inner.load_u64(region, offset)
    }
    fn store_u64(&self, region: RegionId, offset: u64, value: u64) -> Result<(), FabricError> {
        self.inner.store_u64(region, offset, value)
    }
}

impl<E: Endpoint> TimedEndpoint<E> {
    fn timed<T>(&mut self, wr_id: u64, what: What, call: impl FnOnce(&mut E) -> T) -> T {
        if !self.trace.enabled() {
            return call(&mut self.inner);
        }
        let at = self.trace.now();
        let out = call(&mut self.inner);
        let took = self.trace.now() - at;
        self.trace.record(Event { at, took, peer: self.inner.peer(), wr_id, what });
        out
    }
}

impl<E: Endpoint> Endpoint for TimedEndpoint<E> {
    fn peer(&self) -> NodeId {
        self.inner.peer()
    }
    fn post_write(&mut self, wr_id: u64, dst: RemoteAddr, data: &[u8], flags: PostFlags) -> Result<(), FabricError> {
        let what = What::Write { len: data.len() as u32, signaled: flags.is_signaled() };
        self.timed(wr_id, what, |e| e.post_write(wr_id, dst, data, flags))
    }
    fn post_read(
        &mut self,
        wr_id: u64,
        src: RemoteAddr,
        len: u32,
        local_region: RegionId,
        local_offset: u64,
        flags: PostFlags,
    ) -> Result<(), FabricError> {
        let what = What::Read { len, signaled: flags.is_signaled() };
        self.timed(wr_id, what, |e| e.post_read(wr_id, src, len, local_region, local_offset, flags))
    }
    fn prefetch_write(&mut self, dst: RemoteAddr, len: u32) {
        self.inner.prefetch_write(dst, len);
    }
    fn poll_completion(&mut self) -> Option<Completion> {
        if !self.trace.enabled() {
            return self.inner.poll_completion();
        }
        let at = self.trace.now();
        let got = self.inner.poll_completion();
        let took = self.trace.now() - at;
        match &got {
            Some(c) => self.trace.record(Event {
                at,
                took,
                peer: self.inner.peer(),
                wr_id: c.wr_id,
                what: What::Completion { kind: c.kind, ok: c.status.is_ok() },
            }),
            None => self.trace.empty_poll(took),
        }
        got
    }
    fn state(&self) -> EndpointState {
        self.inner.state()
    }
    fn reconnect(&mut self) -> Result<(), FabricError> {
        self.inner.reconnect()
    }
    fn try_reconnect(&mut self) -> Result<bool, FabricError> {
        self.inner.try_reconnect()
    }
    fn peer_gone(&self) -> bool {
        self.inner.peer_gone()
    }
}
