//! Speculative decoding with a drafter, checked against plain greedy decoding of the target.
//!
//! ```sh
//! cargo run --release -p spec-decode --example speculative -- TARGET_DIR DRAFTER_DIR
//! cargo run --release -p spec-decode --example speculative   # tiny random target and drafter
//! ```

use std::path::PathBuf;

use gemma4::generate::{generate, GenerateConfig};
use gemma4::Model;
use spec_decode::dspark::fit_bigram_drafter;
use spec_decode::{load_drafter, speculative_generate, Drafter, SpecConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (target, mut drafter): (Model, Box<dyn Drafter>) = match args.as_slice() {
        [t, d] => {
            let target = Model::load(&PathBuf::from(t))?;
            let drafter = load_drafter(&PathBuf::from(d), target.config())?;
            (target, drafter)
        }
        [] => tiny_pair()?,
        _ => return Err("usage: speculative [TARGET_DIR DRAFTER_DIR]".into()),
    };

    // The whole API: a request as plain decoding takes it, plus the drafter.
    let prompt = [5u32, 6, 7, 8];
    let cfg = SpecConfig { generate: GenerateConfig { max_tokens: 48, ..Default::default() }, ..Default::default() };
    let spec = speculative_generate(&target, drafter.as_mut(), &prompt, &cfg, |t| print!("{t} "))?;
    println!("\n{}", spec.stats.summary());

    // Lossless: greedy speculative output is plain greedy output, token for token.
    let plain = generate(&target, &prompt, &cfg.generate, |_| {})?;
    assert_eq!(spec.tokens, plain.tokens, "speculative output differs from plain decoding");
    println!("identical to plain greedy decoding ({} tokens)", plain.tokens.len());
    Ok(())
}

/// A tiny random target and a DSpark drafter fitted to it by counting the target's own greedy
/// bigrams (a stand-in for a trained drafter: real shapes, some acceptance).
fn tiny_pair() -> Result<(Model, Box<dyn Drafter>), Box<dyn std::error::Error>> {
    let cfg = gemma4::config::tiny_dense_config(128, 512, 2)?;
    let dest = std::env::temp_dir().join("spec-decode-example-tiny");
    let dir = gemma4::checkpoint::write_random_checkpoint(&dest, &cfg, 3, mlx_core::Dtype::Bf16, 1, true)?;
    let target = Model::load(&dir)?;
    let prompts: Vec<Vec<u32>> = (0..8u32).map(|i| (0..6).map(|j| 4 + (i * 53 + j * 17) % 500).collect()).collect();
    let drafter = fit_bigram_drafter(&target, "tiny", &prompts, 64, 4)?;
    Ok((target, Box::new(drafter)))
}
