//! Prints the linked BLAS and the measured f32 matmul speed: `cargo run -p mlx-core --example sgemm`.
fn main() -> mlx_core::Result<()> {
    let check = mlx_core::blas::sgemm_check(1024, 5)?;
    println!(
        "BLAS: {}; f32 1024² matmul: {:.1} GFLOP/s ({})",
        mlx_core::blas::linked().unwrap_or("MLX's bundled reference BLAS"),
        check.gflops,
        if check.is_fast() { "optimized" } else { "slow: no optimized BLAS in effect" }
    );
    println!(
        "row quantum (f32 matmul rows padded to a multiple of it are batch-invariant): {}",
        mlx_core::blas::row_quantum()
    );
    Ok(())
}
