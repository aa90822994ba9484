//! Speed of the packed row kernel on one decode row: `cargo run --release -p mlx-core --example
//! row_quantized_speed` prints ms per product and the packed bytes streamed per second, for
//! 8-bit and 4-bit [4096, 1024] and [1024, 4096] matrices (the mid-size checkpoint's MLP shapes).
use std::time::Instant;

use mlx_core::quant::{self, QuantSpec};
use mlx_core::{random, Dtype};

fn main() -> mlx_core::Result<()> {
    for bits in [8, 4] {
        for (n, k) in [(4096, 1024), (1024, 4096)] {
            let spec = QuantSpec::new(bits, 64)?;
            let w = random::normal(&[n, k], Dtype::F32, 0.0, 0.05, &random::key(1)?)?;
            let q = quant::quantize(&w, spec)?;
            let x = random::normal(&[1, k], Dtype::F32, 0.0, 1.0, &random::key(2)?)?;
            x.eval()?;
            q.weight.eval()?;
            q.scales.eval()?;
            q.biases.eval()?;
            let reps = 400;
            let mut best = f64::INFINITY;
            for _ in 0..5 {
                let t = Instant::now();
                for _ in 0..reps {
                    quant::row_quantized_linear(&x, &q)?.eval()?;
                }
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            let bytes = (n as f64) * (k as f64) * f64::from(bits) / 8.0;
            println!("{bits}-bit [{n}, {k}]: {:.3} ms, {:.1} GB/s packed", best * 1e3, bytes / best / 1e9);
        }
    }
    Ok(())
}
