//! The limit order book and its matching: price-time priority. An incoming order trades with
//! the best-priced resting orders of the other side first, and among orders at one price with
//! the oldest first; each trade is at the resting order's price. What a limit order does not
//! trade rests at its price, behind the orders already there; a market order's rest is dropped.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::command::{Command, Fill, OrderId, Outcome, Rejection, Side};

/// An order waiting in the book.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resting {
    pub id: OrderId,
    pub quantity: u64,
}

/// Both sides of the book. Price levels are queues in arrival order; `located` finds an
/// order's level for a cancel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OrderBook {
    bids: BTreeMap<u64, VecDeque<Resting>>,
    asks: BTreeMap<u64, VecDeque<Resting>>,
    located: HashMap<OrderId, (Side, u64)>,
}

impl OrderBook {
    /// Executes `command`, which places order `id` (a cancel names its target instead).
    pub fn execute(&mut self, id: OrderId, command: Command) -> Outcome {
        match command {
            Command::Limit { quantity: 0, .. } | Command::Market { quantity: 0, .. } => {
                Outcome::Rejected(Rejection::ZeroQuantity)
            }
            Command::Limit { price: 0, .. } => Outcome::Rejected(Rejection::ZeroPrice),
            Command::Limit { side, price, quantity } => {
                let (fills, left) = self.trade(side, Some(price), quantity);
                if left > 0 {
                    self.side_mut(side).entry(price).or_default().push_back(Resting { id, quantity: left });
                    self.located.insert(id, (side, price));
                }
                Outcome::Accepted { order: id, fills, rested: left }
            }
            Command::Market { side, quantity } => {
                let (fills, _dropped) = self.trade(side, None, quantity);
                Outcome::Accepted { order: id, fills, rested: 0 }
            }
            Command::Cancel { order } => match self.cancel(order) {
                true => Outcome::Accepted { order, fills: Vec::new(), rested: 0 },
                false => Outcome::Rejected(Rejection::UnknownOrder),
            },
        }
    }

    fn side_mut(&mut self, side: Side) -> &mut BTreeMap<u64, VecDeque<Resting>> {
        match side {
            Side::Buy => &mut self.bids,
            Side::Sell => &mut self.asks,
        }
    }

    /// The best price on `side`: the highest bid, the lowest ask.
    pub fn best(&self, side: Side) -> Option<u64> {
        match side {
            Side::Buy => self.bids.keys().next_back().copied(),
            Side::Sell => self.asks.keys().next().copied(),
        }
    }

    /// Trades an order of `side` for up to `quantity` against the other side, at prices no
    /// worse than `limit` (any for a market order); returns the fills and what is left.
    fn trade(&mut self, side: Side, limit: Option<u64>, mut quantity: u64) -> (Vec<Fill>, u64) {
        let mut fills = Vec::new();
        let other = side.opposite();
        while quantity > 0 {
            let Some(price) = self.best(other) else { break };
            let crosses = match (side, limit) {
                (_, None) => true,
                (Side::Buy, Some(limit)) => price <= limit,
                (Side::Sell, Some(limit)) => price >= limit,
            };
            if !crosses {
                break;
            }
            let (levels, located) = match other {
                Side::Buy => (&mut self.bids, &mut self.located),
                Side::Sell => (&mut self.asks, &mut self.located),
            };
            let level = levels.get_mut(&price).expect("the best price has a level");
            while quantity > 0 {
                let Some(front) = level.front_mut() else { break };
                let traded = front.quantity.min(quantity);
                fills.push(Fill { maker: front.id, price, quantity: traded });
                front.quantity -= traded;
                quantity -= traded;
                if front.quantity == 0 {
                    located.remove(&front.id);
                    level.pop_front();
                }
            }
            if level.is_empty() {
                levels.remove(&price);
            }
        }
        (fills, quantity)
    }

    /// Removes resting order `order`; false if there is none.
    fn cancel(&mut self, order: OrderId) -> bool {
        let Some((side, price)) = self.located.remove(&order) else { return false };
        let book = self.side_mut(side);
        let level = book.get_mut(&price).expect("a located order's level exists");
        level.retain(|r| r.id != order);
        if level.is_empty() {
            book.remove(&price);
        }
        true
    }

    /// Every resting order, bids from the best price down then asks from the best price up,
    /// each level in arrival order: the book's canonical form (snapshots, digests).
    pub fn resting(&self) -> impl Iterator<Item = (Side, u64, Resting)> + '_ {
        let bids = self.bids.iter().rev().flat_map(|(&p, l)| l.iter().map(move |&r| (Side::Buy, p, r)));
        let asks = self.asks.iter().flat_map(|(&p, l)| l.iter().map(move |&r| (Side::Sell, p, r)));
        bids.chain(asks)
    }

    /// Puts `order` at the back of its level (rebuilding a book from its canonical form).
    pub fn insert(&mut self, side: Side, price: u64, order: Resting) {
        self.side_mut(side).entry(price).or_default().push_back(order);
        self.located.insert(order.id, (side, price));
    }

    /// Resting orders.
    pub fn len(&self) -> usize {
        self.located.len()
    }

    pub fn is_empty(&self) -> bool {
        self.located.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(side: Side, price: u64, quantity: u64) -> Command {
        Command::Limit { side, price, quantity }
    }

    fn fills(outcome: &Outcome) -> Vec<(u64, u64, u64)> {
        match outcome {
            Outcome::Accepted { fills, .. } => fills.iter().map(|f| (f.maker.0, f.price, f.quantity)).collect(),
            Outcome::Rejected(why) => panic!("rejected: {why}"),
        }
    }

    #[test]
    fn better_prices_trade_first_and_at_the_resting_price() {
        let mut book = OrderBook::default();
        book.execute(OrderId(1), limit(Side::Sell, 102, 5));
        book.execute(OrderId(2), limit(Side::Sell, 101, 5));
        let o = book.execute(OrderId(3), limit(Side::Buy, 103, 7));
        assert_eq!(fills(&o), vec![(2, 101, 5), (1, 102, 2)]);
        assert_eq!(book.best(Side::Sell), Some(102));
        assert_eq!(book.best(Side::Buy), None, "the buy traded in full");
    }

    #[test]
    fn at_one_price_the_older_order_trades_first() {
        let mut book = OrderBook::default();
        book.execute(OrderId(1), limit(Side::Buy, 100, 3));
        book.execute(OrderId(2), limit(Side::Buy, 100, 3));
        let o = book.execute(OrderId(3), Command::Market { side: Side::Sell, quantity: 4 });
        assert_eq!(fills(&o), vec![(1, 100, 3), (2, 100, 1)]);
        let left: Vec<_> = book.resting().collect();
        assert_eq!(left, vec![(Side::Buy, 100, Resting { id: OrderId(2), quantity: 2 })]);
    }

    #[test]
    fn a_limit_rests_what_does_not_cross_and_a_market_drops_it() {
        let mut book = OrderBook::default();
        book.execute(OrderId(1), limit(Side::Sell, 105, 2));
        let o = book.execute(OrderId(2), limit(Side::Buy, 104, 4));
        assert_eq!(o, Outcome::Accepted { order: OrderId(2), fills: Vec::new(), rested: 4 });
        let o = book.execute(OrderId(3), Command::Market { side: Side::Buy, quantity: 10 });
        assert_eq!(
            o,
            Outcome::Accepted {
                order: OrderId(3),
                fills: vec![Fill { maker: OrderId(1), price: 105, quantity: 2 }],
                rested: 0
            }
        );
        assert_eq!(book.len(), 1, "only the resting bid is left; the market order's rest is dropped");
    }

    #[test]
    fn cancels_remove_resting_orders_and_refuse_unknown_ones() {
        let mut book = OrderBook::default();
        book.execute(OrderId(1), limit(Side::Buy, 100, 3));
        book.execute(OrderId(2), limit(Side::Buy, 100, 3));
        assert!(matches!(book.execute(OrderId(9), Command::Cancel { order: OrderId(1) }), Outcome::Accepted { .. }));
        assert_eq!(
            book.execute(OrderId(10), Command::Cancel { order: OrderId(1) }),
            Outcome::Rejected(Rejection::UnknownOrder)
        );
        let o = book.execute(OrderId(11), Command::Market { side: Side::Sell, quantity: 1 });
        assert_eq!(fills(&o), vec![(2, 100, 1)]);
    }

    #[test]
    fn empty_and_free_orders_are_refused() {
        let mut book = OrderBook::default();
        assert_eq!(book.execute(OrderId(1), limit(Side::Buy, 100, 0)), Outcome::Rejected(Rejection::ZeroQuantity));
        assert_eq!(book.execute(OrderId(2), limit(Side::Buy, 0, 5)), Outcome::Rejected(Rejection::ZeroPrice));
        assert!(book.is_empty());
    }
}
