//! Ops as `&self` methods returning `Result<Array>`, so chains read `x.reshape(..)?.transpose(..)?`.
//! There are no `std::ops` overloads: they would have to panic on broadcast errors.

mod elementwise;
mod index;
mod reduce;
mod shape;

pub use elementwise::{gelu_approx, where_};
pub use shape::concatenate;
