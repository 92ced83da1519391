//! What clients send the book, and what it answers: fixed-size little-endian encodings that
//! decode with a typed error (a command comes from a client; a reply from the replica).
//!
//! ```text
//! command  kind u8 (1 limit, 2 market, 3 cancel) | side u8 (1 buy, 2 sell; 0 for cancel)
//!          | price u64 (ticks; 0 for market, cancel) | quantity u64 (0 for cancel)
//!          | order u64 (the order to cancel; 0 otherwise)                       = 26 bytes
//! reply    status u8 (1 accepted, 2 rejected) | order u64 (the new order's id) | rested u64
//!          | fills u32 | fills x (maker u64, price u64, quantity u64)          (accepted)
//!          status u8 = 2 | reason u8                                          (rejected)
//! ```

/// Which side of the book an order is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    Buy,
    Sell,
}

impl Side {
    /// The side an order of this side trades against.
    pub fn opposite(self) -> Self {
        match self {
            Self::Buy => Self::Sell,
            Self::Sell => Self::Buy,
        }
    }
}

/// An order's id: the log position of the command that placed it (entry << 12 | position in
/// its batch), the same on every replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrderId(pub u64);

impl OrderId {
    /// The id of the order placed by the command at `index`.
    pub fn at(index: microrep::Index) -> Self {
        Self(index.entry << 12 | u64::from(index.position & 0xfff))
    }
}

/// A client's command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Buy or sell up to `quantity` at `price` or better; what does not trade rests.
    Limit { side: Side, price: u64, quantity: u64 },
    /// Buy or sell up to `quantity` at the best prices available; what does not trade is
    /// dropped (immediate or cancel).
    Market { side: Side, quantity: u64 },
    /// Remove a resting order.
    Cancel { order: OrderId },
}

/// Bytes of an encoded command.
pub const COMMAND_BYTES: usize = 26;

/// A command that does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("a command is {COMMAND_BYTES} bytes, not {0}")]
    Length(usize),
    #[error("unknown command kind {0}")]
    Kind(u8),
    #[error("unknown side {0} (1 buy, 2 sell)")]
    Side(u8),
    #[error("a reply ends early")]
    ShortReply,
    #[error("unknown reply status {0}")]
    Status(u8),
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes.get(at..at + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes)
}

impl Command {
    pub fn encode(&self) -> [u8; COMMAND_BYTES] {
        let (kind, side, price, quantity, order) = match *self {
            Self::Limit { side, price, quantity } => (1u8, side, price, quantity, 0),
            Self::Market { side, quantity } => (2, side, 0, quantity, 0),
            Self::Cancel { order } => (3, Side::Buy, 0, 0, order.0),
        };
        let mut out = [0u8; COMMAND_BYTES];
        out[0] = kind;
        out[1] = if kind == 3 {
            0
        } else {
            match side {
                Side::Buy => 1,
                Side::Sell => 2,
            }
        };
        out[2..10].copy_from_slice(&price.to_le_bytes());
        out[10..18].copy_from_slice(&quantity.to_le_bytes());
        out[18..26].copy_from_slice(&order.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() != COMMAND_BYTES {
            return Err(DecodeError::Length(bytes.len()));
        }
        let side = || match bytes[1] {
            1 => Ok(Side::Buy),
            2 => Ok(Side::Sell),
            other => Err(DecodeError::Side(other)),
        };
        let (price, quantity, order) = (u64_at(bytes, 2), u64_at(bytes, 10), u64_at(bytes, 18));
        match bytes[0] {
            1 => Ok(Self::Limit { side: side()?, price, quantity }),
            2 => Ok(Self::Market { side: side()?, quantity }),
            3 => Ok(Self::Cancel { order: OrderId(order) }),
            other => Err(DecodeError::Kind(other)),
        }
    }
}

/// One trade: the resting order it hit, at that order's price.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fill {
    pub maker: OrderId,
    pub price: u64,
    pub quantity: u64,
}

/// Why the book refused a command (the same on every replica).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("the command does not decode")]
    Malformed,
    #[error("a quantity of 0")]
    ZeroQuantity,
    #[error("a limit price of 0")]
    ZeroPrice,
    #[error("no such resting order")]
    UnknownOrder,
}

impl Rejection {
    fn code(self) -> u8 {
        match self {
            Self::Malformed => 1,
            Self::ZeroQuantity => 2,
            Self::ZeroPrice => 3,
            Self::UnknownOrder => 4,
        }
    }

    fn from_code(code: u8) -> Self {
        match code {
            2 => Self::ZeroQuantity,
            3 => Self::ZeroPrice,
            4 => Self::UnknownOrder,
            _ => Self::Malformed,
        }
    }
}

/// What the book did with a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Placed as `order` (a cancel names the order it removed): its fills, and the quantity
    /// left resting (0 for a market order or a cancel).
    Accepted {
        order: OrderId,
        fills: Vec<Fill>,
        rested: u64,
    },
    Rejected(Rejection),
}

impl Outcome {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Accepted { order, fills, rested } => {
                out.push(1);
                out.extend_from_slice(&order.0.to_le_bytes());
                out.extend_from_slice(&rested.to_le_bytes());
                out.extend_from_slice(&(fills.len() as u32).to_le_bytes());
                for f in fills {
                    out.extend_from_slice(&f.maker.0.to_le_bytes());
                    out.extend_from_slice(&f.price.to_le_bytes());
                    out.extend_from_slice(&f.quantity.to_le_bytes());
                }
            }
            Self::Rejected(why) => out.extend_from_slice(&[2, why.code()]),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        match bytes.first() {
            Some(1) => {
                let count = bytes.get(17..21).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
                let count = count.ok_or(DecodeError::ShortReply)? as usize;
                if bytes.len() != 21 + 24 * count {
                    return Err(DecodeError::ShortReply);
                }
                let fills = (0..count)
                    .map(|i| 21 + 24 * i)
                    .map(|at| Fill {
                        maker: OrderId(u64_at(bytes, at)),
                        price: u64_at(bytes, at + 8),
                        quantity: u64_at(bytes, at + 16),
                    })
                    .collect();
                Ok(Self::Accepted { order: OrderId(u64_at(bytes, 1)), fills, rested: u64_at(bytes, 9) })
            }
            Some(2) => bytes.get(1).map(|&c| Self::Rejected(Rejection::from_code(c))).ok_or(DecodeError::ShortReply),
            Some(&other) => Err(DecodeError::Status(other)),
            None => Err(DecodeError::ShortReply),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip() {
        for c in [
            Command::Limit { side: Side::Buy, price: 100, quantity: 5 },
            Command::Limit { side: Side::Sell, price: u64::MAX, quantity: 1 },
            Command::Market { side: Side::Sell, quantity: 7 },
            Command::Cancel { order: OrderId(9 << 12 | 3) },
        ] {
            assert_eq!(Command::decode(&c.encode()), Ok(c));
        }
    }

    #[test]
    fn bad_commands_are_refused_by_name() {
        assert_eq!(Command::decode(&[1, 1]), Err(DecodeError::Length(2)));
        let mut bytes = Command::Market { side: Side::Buy, quantity: 1 }.encode();
        bytes[0] = 9;
        assert_eq!(Command::decode(&bytes), Err(DecodeError::Kind(9)));
        bytes[0] = 1;
        bytes[1] = 7;
        assert_eq!(Command::decode(&bytes), Err(DecodeError::Side(7)));
    }

    #[test]
    fn outcomes_round_trip() {
        let fills = vec![Fill { maker: OrderId(4096), price: 10, quantity: 2 }];
        for o in [
            Outcome::Accepted { order: OrderId(8192), fills, rested: 3 },
            Outcome::Accepted { order: OrderId(1), fills: Vec::new(), rested: 0 },
            Outcome::Rejected(Rejection::UnknownOrder),
        ] {
            let mut bytes = Vec::new();
            o.encode(&mut bytes);
            assert_eq!(Outcome::decode(&bytes), Ok(o));
        }
        assert_eq!(Outcome::decode(&[1, 0, 0]), Err(DecodeError::ShortReply));
        assert_eq!(Outcome::decode(&[5]), Err(DecodeError::Status(5)));
    }
}
