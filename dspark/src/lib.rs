//! The `dspark` command line as a library: one module per subcommand, each with its clap
//! `Args` and a `run` function, so the subcommands can be driven and tested without the binary.
//! `main.rs` only parses the command line and dispatches.
#![forbid(unsafe_code)]

pub mod calibrate;
pub mod doctor;
pub mod eval_drafter;
pub mod generate;
pub mod paths;
pub mod plot;
pub mod profile;
pub mod quantize_drafter;
pub mod quantize_target;
pub mod regen;
pub mod serve;
pub mod train;
pub mod train_target;

// Shared with `dspark-serve`, so they live in the engine crate.
pub use engine::{default_model, schedule};
