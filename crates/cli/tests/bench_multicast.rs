//! `microrep bench multicast --processes`: every member in its own process on shm.

use std::process::Command;

mod json_row;

use json_row::number;

#[test]
fn members_in_separate_processes_deliver_every_message_and_time_each_delivery() {
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["bench", "multicast", "--processes", "--members", "3", "--sizes", "8,64", "--millis", "100", "--json"])
        .output()
        .expect("run microrep bench multicast --processes");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bench failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for size in [8, 64] {
        let row = text
            .lines()
            .find(|l| l.contains(&format!("\"size\":{size},")))
            .unwrap_or_else(|| panic!("no row for {size} bytes in:\n{text}"));
        assert!(row.contains("\"processes\":true") && row.contains("\"members\":3"), "{row}");
        let sent = number(row, "sent");
        assert!(sent > 0, "{row}");
        assert_eq!((number(row, "delivered_min"), number(row, "lost")), (sent, 0), "{row}");
        // Each message's delivery at each of the three members, from the stamp in its payload.
        assert_eq!(number(row, "samples"), 3 * sent, "{row}");
    }
}

#[test]
fn processes_on_tcp_are_refused_with_the_reason() {
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["bench", "multicast", "--processes", "--fabric", "tcp", "--millis", "10"])
        .output()
        .expect("run microrep bench multicast");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--processes runs on the shm fabric"), "{err}");
}
