//! A book replicated by three microrep replicas on the shm fabric: every replica ends with the
//! same book, and every outcome a client got is what the book executed in place, in log order,
//! would have answered (order ids from the log positions), up to the first outcome a client
//! could not learn (a leader change on a busy machine): from there only the replicas'
//! agreement is checked.

use std::time::{Duration, Instant};

use microrep::config::AttachMode;
use microrep_orderbook::local::{LocalCluster, ProposeFailure as LocalError};
use microrep_orderbook::{OrderFlow, Outcome, ReplicatedBook};

#[test]
fn three_replicas_execute_a_seeded_flow_like_the_book_in_place() {
    let name = format!("orderbook-test-{}", std::process::id());
    let mut cluster = LocalCluster::start(&name, 3, AttachMode::Direct, 5_000).expect("start");
    cluster.await_leader(Duration::from_secs(30)).expect("a leader");
    let mut flow = OrderFlow::new(42);
    let mut in_place = ReplicatedBook::default();
    let (mut fills, mut compared, mut known) = (0, 0, true);
    for _ in 0..3_000 {
        let command = flow.next_command();
        let (index, outcome) = match cluster.propose(&command) {
            Ok(placed) => placed,
            Err(LocalError::Propose(e)) if e.outcome_unknown() => {
                known = false;
                continue;
            }
            Err(e) => panic!("{command:?}: {e}"),
        };
        if known {
            let mut reply = Vec::new();
            in_place.execute(index, &command.encode(), &mut reply);
            assert_eq!(Outcome::decode(&reply).as_ref(), Ok(&outcome), "at {index:?}");
            compared += 1;
        }
        if let Outcome::Accepted { fills: f, .. } = &outcome {
            fills += f.len();
        }
        flow.observe(&outcome);
    }
    assert!(fills > 500, "the flow traded ({fills} fills)");
    assert!(compared > 0, "no outcome was known");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let digests = cluster.digests();
        if digests.windows(2).all(|w| w[0] == w[1]) && digests[0].0 >= compared {
            if known {
                let want = format!("{:016x}", microrep::Apply::digest(&in_place).expect("a digest"));
                assert_eq!(digests[0].1.as_deref(), Some(want.as_str()), "the replicas' digest is the book's");
            }
            break;
        }
        assert!(Instant::now() < deadline, "replicas did not converge: {digests:?}");
        std::thread::yield_now();
    }
}
