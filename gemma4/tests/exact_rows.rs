//! The GPU's cure for batch-dependent products, run on the CPU with mlx-core's row kernels off:
//! MLX's own CPU products (the BLAS's GEMV for one row, tiled kernels for several) then round a
//! lone row differently from the same row in a batch, as a GPU's do. With every few-row product
//! run as one fixed 16-row block (`ExactRows::Block`), stepwise verify rows must equal one-token
//! decode steps bit for bit, in f32, bf16 and 4-bit, dense and MoE.
//!
//! One test in its own binary: it turns the row kernels off (`MLX_CORE_ROW_LINEAR=0`, read once
//! per process) and sets the process-wide mode.

mod common;

use common::check_stepwise_rounds;
use gemma4::checkpoint::quantize_checkpoint;
use gemma4::weights::{set_exact_rows, ExactRows};
use gemma4::{ComputeDtype, Model};
use mlx_core::Device;

#[test]
fn row_blocks_make_verify_rows_decode_steps_without_the_row_kernels() {
    std::env::set_var("MLX_CORE_ROW_LINEAR", "0");
    assert!(!mlx_core::blas::row_linear_enabled(), "the row kernels must be off for this test");
    let rounds = [(4, 1), (8, 2), (1, 1), (6, 6), (5, 3), (9, 9), (3, 2), (17, 4), (2, 2)];
    let q4 = quantize_checkpoint(common::tiny_a(), &common::scratch("tiny-a-q4-exact-rows"), 4, 64, true).unwrap();
    let models = [
        ("f32", Model::load_as(common::tiny_a(), ComputeDtype::F32, Device::Cpu).unwrap().0),
        ("bf16", Model::load(common::tiny_a()).unwrap()),
        ("4-bit", Model::load(&q4).unwrap()),
        ("MoE f32", Model::load(common::tiny_b_f32()).unwrap()),
    ];

    // How often MLX's own products break the identity here (reported, not asserted: it depends
    // on the BLAS; OpenBLAS does for f32).
    set_exact_rows(Some(ExactRows::None));
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for (name, m) in &models {
        let broken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_stepwise_rounds(m, 11, &rounds)));
        eprintln!(
            "{name}: without row blocks, stepwise rows {} decode steps",
            if broken.is_ok() { "equal" } else { "differ from" }
        );
    }
    std::panic::set_hook(hook);

    set_exact_rows(Some(ExactRows::Block));
    for (_, m) in &models {
        for plen in [3, 11] {
            check_stepwise_rounds(m, plen, &rounds);
        }
    }
    set_exact_rows(None);
}
