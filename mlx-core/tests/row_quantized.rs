//! The packed 8/4-bit row kernel: its rows are `row_linear` on the matrix dequantized with
//! `fma(q, scale, bias)` bit for bit, whatever the number of rows; it reads MLX's packing (it
//! agrees with MLX's quantized matmul); its vector forms give the portable form's bits.

use mlx_core::quant::{self, QuantSpec, Quantized};
use mlx_core::{random, Array, Dtype};

fn f32s(a: &Array) -> Vec<f32> {
    a.to_f32_vec().unwrap()
}

/// The packed matrix dequantized on the host the way the kernel does it: one fma per weight.
fn fma_dequantized(q: &Quantized, n: usize, k: usize) -> Array {
    let (bits, group) = (q.spec.bits() as usize, q.spec.group_size() as usize);
    let bytes = q.weight.to_bytes().unwrap(); // uint32 words, little-endian: the packed bytes
    let (s, b) = (f32s(&q.scales), f32s(&q.biases));
    let groups = k / group;
    let mut dense = vec![0f32; n * k];
    for i in 0..n {
        let row = &bytes[i * k * bits / 8..(i + 1) * k * bits / 8];
        for j in 0..k {
            let v = match bits {
                8 => row[j],
                _ if j % 2 == 0 => row[j / 2] & 15,
                _ => row[j / 2] >> 4,
            };
            let g = i * groups + j / group;
            dense[i * k + j] = f32::from(v).mul_add(s[g], b[g]);
        }
    }
    Array::from_slice(&dense, &[n as i32, k as i32]).unwrap()
}

#[test]
fn packed_rows_are_row_linear_on_the_dequantized_matrix() {
    for (bits, group, k, n) in [(8, 64, 256, 12), (4, 64, 256, 12), (8, 32, 96, 5), (4, 128, 384, 9), (4, 32, 1024, 21)]
    {
        let spec = QuantSpec::new(bits, group).unwrap();
        let key = random::key(u64::from(bits * 1000 + group) + k as u64).unwrap();
        let w = random::normal(&[n as i32, k as i32], Dtype::F32, 0.0, 0.05, &key).unwrap(); // [N, K]
        let x = random::normal(&[40, k as i32], Dtype::F32, 0.0, 1.0, &random::key(3).unwrap()).unwrap();
        let q = quant::quantize(&w, spec).unwrap();
        assert_eq!(q.scales.dtype(), Dtype::F32);
        assert!(q.row_readable());
        let all = quant::row_quantized_linear(&x, &q).unwrap(); // [40, N]
        let want = mlx_core::blas::row_linear(&x, &fma_dequantized(&q, n, k)).unwrap();
        let case = format!("{bits}-bit, group {group}, [40, {k}] x [{n}, {k}]");
        assert_eq!(all.to_bytes().unwrap(), want.to_bytes().unwrap(), "{case}: differs from row_linear");
        // MLX's own quantized matmul reads the same packing (its sums in another order).
        let reference = quant::quantized_matmul(&x, &q.weight, &q.scales, &q.biases, true, spec).unwrap();
        let max = f32s(&all).iter().zip(f32s(&reference)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(max < 1e-4 * (k as f32).sqrt(), "{case}: differs from MLX's quantized matmul by {max}");
        for (start, rows) in [(0, 1), (5, 1), (3, 2), (2, 3), (7, 5), (9, 7), (0, 8), (11, 9), (20, 17)] {
            let part = quant::row_quantized_linear(&x.slice_axis(0, start, start + rows).unwrap(), &q).unwrap();
            let want = all.slice_axis(0, start, start + rows).unwrap();
            assert_eq!(part.to_bytes().unwrap(), want.to_bytes().unwrap(), "{case}: rows {start}..+{rows}");
        }
        for m in [1, 2, 3, 5, 8, 9, 17] {
            assert!(quant::row_quantized_paths_agree(m, k, n, spec), "{case}: vector forms differ at {m} rows");
        }
    }
}

/// `Quantized::matmul_t` on the CPU: few rows through the packed kernel, many through the BLAS on
/// the dequantized matrix; both close to MLX's quantized matmul.
#[test]
fn quantized_matmul_picks_the_row_kernel_for_few_rows() {
    let spec = QuantSpec::new(4, 64).unwrap();
    let w = random::normal(&[24, 128], Dtype::F32, 0.0, 0.05, &random::key(9).unwrap()).unwrap();
    let q = quant::quantize(&w, spec).unwrap();
    for rows in [1, 7, 64, 65, 130] {
        let x = random::normal(&[rows, 128], Dtype::F32, 0.0, 1.0, &random::key(rows as u64).unwrap()).unwrap();
        let got = q.matmul_t(&x).unwrap();
        let reference = quant::quantized_matmul(&x, &q.weight, &q.scales, &q.biases, true, spec).unwrap();
        assert_eq!(got.shape().unwrap(), vec![rows, 24]);
        let max = f32s(&got).iter().zip(f32s(&reference)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(max < 1e-3, "{rows} rows: differs from MLX's quantized matmul by {max}");
        if rows <= 64 && mlx_core::blas::row_linear_enabled() {
            let packed = quant::row_quantized_linear(&x, &q).unwrap();
            assert_eq!(got.to_bytes().unwrap(), packed.to_bytes().unwrap(), "{rows} rows: not the row kernel");
        }
    }
}

#[test]
fn bad_packed_inputs_are_refused() {
    let w = random::normal(&[8, 64], Dtype::F32, 0.0, 0.05, &random::key(1).unwrap()).unwrap();
    let x = Array::zeros(&[2, 64], Dtype::F32).unwrap();
    let six = quant::quantize(&w, QuantSpec::new(6, 64).unwrap()).unwrap();
    assert!(!six.row_readable());
    assert!(quant::row_quantized_linear(&x, &six).unwrap_err().to_string().contains("bits must be 4 or 8"));
    let q = quant::quantize(&w, QuantSpec::new(8, 64).unwrap()).unwrap();
    let narrow = Array::zeros(&[2, 32], Dtype::F32).unwrap();
    assert!(quant::row_quantized_linear(&narrow, &q).unwrap_err().to_string().contains("uint32 [N, K·bits/32]"));
    let half = Quantized { scales: q.scales.astype(Dtype::Bf16).unwrap(), ..q.clone() };
    assert!(!half.row_readable());
    assert!(quant::row_quantized_linear(&x, &half)
        .unwrap_err()
        .to_string()
        .contains("scales and biases must be float32"));
    assert!(quant::row_quantized_linear(&x.astype(Dtype::Bf16).unwrap(), &q).is_err());
}
