//! The engine the router tests serve: the engine crate's fixtures (a tiny random target and a
//! drafter fitted to it).

#![allow(dead_code)]

pub use engine::testing::{drafter_dir, target_dir};
use serve::{Engine, EngineConfig};

/// An engine on the fixtures; speculative when `drafter`.
pub fn engine(drafter: bool, max_concurrency: usize) -> Engine {
    let mut cfg = EngineConfig::new(target_dir().clone(), "tiny".into());
    cfg.drafter_dir = drafter.then(|| drafter_dir().clone());
    cfg.max_concurrency = max_concurrency;
    Engine::start(cfg).expect("engine")
}
