//! A seeded flow of orders: limit orders around a drifting mid price (most of them resting
//! near the touch, some crossing it), market orders, and cancels of orders seen resting. The
//! same seed gives the same commands as long as the same outcomes are observed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::command::{Command, OrderId, Outcome, Side};

/// Where the mid price starts, in ticks.
const START_MID: u64 = 10_000;
/// How far from the mid a limit order is placed, at most, in ticks.
const SPREAD: u64 = 20;
/// Most resting orders remembered for cancels.
const REMEMBERED: usize = 4096;

/// The order generator.
#[derive(Debug)]
pub struct OrderFlow {
    rng: ChaCha8Rng,
    mid: u64,
    resting: Vec<OrderId>,
}

impl OrderFlow {
    pub fn new(seed: u64) -> Self {
        Self { rng: ChaCha8Rng::seed_from_u64(seed), mid: START_MID, resting: Vec::new() }
    }

    /// The next command: 70% limit, 10% market, 20% cancel (a limit while none is known).
    pub fn next_command(&mut self) -> Command {
        if self.rng.random_bool(0.05) {
            self.mid = self.mid.saturating_add_signed(self.rng.random_range(-3..=3)).max(SPREAD + 1);
        }
        let side = if self.rng.random_bool(0.5) { Side::Buy } else { Side::Sell };
        let quantity = self.rng.random_range(1..=100);
        let roll = self.rng.random_range(0..100);
        if roll < 20 && !self.resting.is_empty() {
            let at = self.rng.random_range(0..self.resting.len());
            return Command::Cancel { order: self.resting.swap_remove(at) };
        }
        if roll < 30 {
            return Command::Market { side, quantity };
        }
        // Mostly passive (behind the mid on its own side), one in five crossing it.
        let offset = self.rng.random_range(0..=SPREAD);
        let passive = self.rng.random_bool(0.8);
        let price = match (side, passive) {
            (Side::Buy, true) | (Side::Sell, false) => self.mid - offset,
            (Side::Sell, true) | (Side::Buy, false) => self.mid + offset,
        };
        Command::Limit { side, price, quantity }
    }

    /// Learns from an outcome which orders rest (candidates for later cancels).
    pub fn observe(&mut self, outcome: &Outcome) {
        if let Outcome::Accepted { order, rested, .. } = outcome
            && *rested > 0
        {
            if self.resting.len() == REMEMBERED {
                self.resting.swap_remove(0);
            }
            self.resting.push(*order);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_flow_and_all_kinds_occur() {
        let (mut a, mut b) = (OrderFlow::new(7), OrderFlow::new(7));
        let mut kinds = [0u32; 3];
        for i in 0..2_000u64 {
            let (ca, cb) = (a.next_command(), b.next_command());
            assert_eq!(ca, cb);
            kinds[match ca {
                Command::Limit { .. } => 0,
                Command::Market { .. } => 1,
                Command::Cancel { .. } => 2,
            }] += 1;
            let rested = Outcome::Accepted { order: OrderId(i), fills: Vec::new(), rested: 1 };
            a.observe(&rested);
            b.observe(&rested);
        }
        assert!(kinds.iter().all(|&k| k > 100), "{kinds:?}");
        let ten = |seed| {
            let mut flow = OrderFlow::new(seed);
            (0..10).map(|_| flow.next_command()).collect::<Vec<_>>()
        };
        assert_ne!(ten(8), ten(7), "another seed, another flow");
    }
}
