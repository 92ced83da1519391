//! A replicated limit order book and matching engine on microrep, the application the Mu paper
//! replicates (Liquibook): price-time priority, limit, market and cancel orders, order ids
//! from the log position of the command that placed them, a digest of the book and of its
//! history, and a seeded order flow for the benchmark (`orderbook-bench`, docs/BENCHMARKS.md).

pub mod book;
pub mod command;
pub mod load;
pub mod local;
pub mod machine;

pub use book::{OrderBook, Resting};
pub use command::{Command, DecodeError, Fill, OrderId, Outcome, Rejection, Side};
pub use load::OrderFlow;
pub use machine::ReplicatedBook;
