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

/// A first sender that never sends holds nobody up: its member's null-sends let the others'
/// messages through, in separate processes as in threads; alone, it sends nothing.
#[test]
fn a_stalled_sender_process_sends_nothing_and_lets_the_others_messages_through_on_null_sends() {
    let out = Command::new(env!("CARGO_BIN_EXE_microrep"))
        .args(["bench", "multicast", "--processes", "--members", "3", "--senders", "one,all", "--sizes", "64"])
        .args(["--slow-sender-us", "0", "--millis", "100", "--json"])
        .output()
        .expect("run microrep bench multicast --processes --slow-sender-us 0");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bench failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let row = |senders: u32| {
        text.lines()
            .find(|l| l.contains(&format!("\"senders\":{senders},")) && l.contains("\"slow_sender_us\":0"))
            .unwrap_or_else(|| panic!("no row for {senders} senders in:\n{text}"))
    };
    assert_eq!((number(row(1), "sent"), number(row(1), "lost")), (0, 0), "the stalled sender alone: {}", row(1));
    assert!(row(1).contains("\"p50_ns\":null,"), "no latency printed for no delivery: {}", row(1));
    let all = row(3);
    let sent = number(all, "sent");
    assert!(sent > 0, "the two other senders sent: {all}");
    assert_eq!((number(all, "delivered_min"), number(all, "lost")), (sent, 0), "{all}");
    assert!(number(all, "nulls") > 0, "the stalled member moved the order on with nulls: {all}");
}
