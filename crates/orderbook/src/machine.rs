//! The book as microrep's replicated state machine: every replica executes the same commands in
//! log order, so every replica holds the same book and answers the same outcomes. Order ids
//! come from the log position of the command that placed them.

use microrep::{Apply, Index, RestoreError};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::book::{OrderBook, Resting};
use crate::command::{Command, OrderId, Outcome, Rejection, Side};

/// The replicated book: the book, and a digest folded over every outcome in log order (equal
/// on replicas that executed the same commands).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicatedBook {
    book: OrderBook,
    executed: u64,
    history: u64,
}

impl ReplicatedBook {
    /// Executes an encoded command as the log's command at `index` and writes the encoded
    /// outcome to `reply` (a command that does not decode is rejected, on every replica alike).
    pub fn execute(&mut self, index: Index, command: &[u8], reply: &mut Vec<u8>) {
        let outcome = match Command::decode(command) {
            Ok(command) => self.book.execute(OrderId::at(index), command),
            Err(_) => Outcome::Rejected(Rejection::Malformed),
        };
        outcome.encode(reply);
        self.executed += 1;
        self.history = xxh3_64_with_seed(reply, self.history);
    }

    pub fn book(&self) -> &OrderBook {
        &self.book
    }

    /// A digest of the resting orders alone, in the book's canonical order.
    pub fn book_digest(&self) -> u64 {
        let mut bytes = Vec::new();
        encode_book(&self.book, &mut bytes);
        xxh3_64_with_seed(&bytes, 0)
    }
}

/// Resting orders, one record each in canonical order: side u8, price u64, id u64, quantity u64.
fn encode_book(book: &OrderBook, out: &mut Vec<u8>) {
    for (side, price, order) in book.resting() {
        out.push(match side {
            Side::Buy => 1,
            Side::Sell => 2,
        });
        for word in [price, order.id.0, order.quantity] {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
}

const RECORD: usize = 25;

impl Apply for ReplicatedBook {
    fn apply(&mut self, index: Index, command: &[u8], reply: &mut Vec<u8>) {
        self.execute(index, command, reply);
    }

    /// executed u64 | history u64 | resting orders (see `encode_book`).
    fn snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.executed.to_le_bytes());
        out.extend_from_slice(&self.history.to_le_bytes());
        encode_book(&self.book, out);
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        let bad = |why: &str| RestoreError::Application(format!("order book snapshot: {why}"));
        let (head, records) = snapshot.split_at_checked(16).ok_or_else(|| bad("shorter than its header"))?;
        if records.len() % RECORD != 0 {
            return Err(bad("a record is cut short"));
        }
        let word =
            |b: &[u8], at: usize| b.get(at..at + 8).and_then(|w| w.try_into().ok()).map_or(0, u64::from_le_bytes);
        let mut book = OrderBook::default();
        for record in records.chunks_exact(RECORD) {
            let side = match record[0] {
                1 => Side::Buy,
                2 => Side::Sell,
                other => return Err(bad(&format!("unknown side {other}"))),
            };
            let resting = Resting { id: OrderId(word(record, 9)), quantity: word(record, 17) };
            book.insert(side, word(record, 1), resting);
        }
        *self = Self { book, executed: word(head, 0), history: word(head, 8) };
        Ok(())
    }

    fn digest(&self) -> Option<u64> {
        Some(self.history)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(entry: u64) -> Index {
        Index { entry, position: 0 }
    }

    #[test]
    fn ids_come_from_the_log_and_snapshots_restore_the_same_book() {
        let mut a = ReplicatedBook::default();
        let mut reply = Vec::new();
        a.execute(at(5), &Command::Limit { side: Side::Buy, price: 99, quantity: 4 }.encode(), &mut reply);
        assert_eq!(
            Outcome::decode(&reply),
            Ok(Outcome::Accepted { order: OrderId(5 << 12), fills: Vec::new(), rested: 4 })
        );
        for (i, price) in [(6, 101), (7, 101), (8, 100)] {
            a.execute(at(i), &Command::Limit { side: Side::Sell, price, quantity: 2 }.encode(), &mut Vec::new());
        }
        let mut snapshot = Vec::new();
        a.snapshot(&mut snapshot);
        let mut b = ReplicatedBook::default();
        b.restore(&snapshot).expect("restores");
        assert_eq!(a, b, "the same book, in the same time order at each price");
        let market = Command::Market { side: Side::Buy, quantity: 3 }.encode();
        let (mut ra, mut rb) = (Vec::new(), Vec::new());
        a.execute(at(9), &market, &mut ra);
        b.execute(at(9), &market, &mut rb);
        assert_eq!(ra, rb);
        assert_eq!((a.digest(), a.book_digest()), (b.digest(), b.book_digest()));
    }

    #[test]
    fn garbage_is_rejected_alike_and_bad_snapshots_are_refused() {
        let mut book = ReplicatedBook::default();
        let mut reply = Vec::new();
        book.execute(at(1), b"not an order", &mut reply);
        assert_eq!(Outcome::decode(&reply), Ok(Outcome::Rejected(Rejection::Malformed)));
        assert!(book.restore(&[0; 7]).is_err());
        assert!(book.restore(&[0; 20]).is_err(), "a record cut short");
        let mut bad_side = vec![0u8; 16 + RECORD];
        bad_side[16] = 9;
        assert!(book.restore(&bad_side).is_err());
        assert_eq!(book.executed, 1, "a refused snapshot leaves the state as it was");
    }
}
