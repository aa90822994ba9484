//! Load a Gemma-4 checkpoint and decode greedily, streaming token ids.
//!
//! ```sh
//! cargo run --release -p gemma4 --example generate -- MODEL_DIR [TOKEN_ID ...]
//! cargo run --release -p gemma4 --example generate     # a tiny random checkpoint, written first
//! ```

use std::path::PathBuf;

use gemma4::generate::{generate, GenerateConfig};
use gemma4::Model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = match args.next() {
        Some(d) => PathBuf::from(d),
        None => {
            // No checkpoint given: write a small random one (weights are noise, ids are real).
            let cfg = gemma4::config::tiny_dense_config(128, 512, 2)?;
            let dest = std::env::temp_dir().join("gemma4-example-tiny");
            gemma4::checkpoint::write_random_checkpoint(&dest, &cfg, 0, mlx_core::Dtype::Bf16, 1, true)?
        }
    };
    let prompt: Vec<u32> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    let prompt = if prompt.is_empty() { vec![5, 6, 7, 8] } else { prompt };

    let model = Model::load(&dir)?;
    let cfg =
        GenerateConfig { max_tokens: 32, stop_tokens: model.config().eos_token_ids.clone(), ..Default::default() };
    let out = generate(&model, &prompt, &cfg, |t| print!("{t} "))?;
    println!("\n{} tokens, {:.1} tok/s", out.tokens.len(), out.stats.decode_tok_per_s());
    Ok(())
}
