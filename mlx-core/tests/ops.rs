//! Each op against values computed by hand (or by a closed form in f64).

use mlx_core::fast::{self, Mask, RopeFreqs};
use mlx_core::quant::{self, QuantSpec};
use mlx_core::{concatenate, gelu_approx, random, where_, Array, Dtype, Error};

type R = Result<(), Error>;

fn f32s(a: &Array) -> Vec<f32> {
    a.to_f32_vec().unwrap()
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "lengths differ: {a:?} vs {b:?}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "element {i}: {x} vs {y} (tol {tol}); {a:?} vs {b:?}");
    }
}

fn arr(v: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

#[test]
fn arithmetic_and_broadcast() -> R {
    let a = arr(&[1., 2., 3., 4.], &[2, 2]);
    let b = arr(&[10., 20.], &[2]);
    assert_eq!(a.add(&b)?.to_vec::<f32>()?, vec![11., 22., 13., 24.]);
    assert_eq!(a.subtract(&b)?.to_vec::<f32>()?, vec![-9., -18., -7., -16.]);
    assert_eq!(a.multiply(&b)?.to_vec::<f32>()?, vec![10., 40., 30., 80.]);
    assert_eq!(a.divide(&b)?.to_vec::<f32>()?, vec![0.1, 0.1, 0.3, 0.2]);
    assert_eq!(a.maximum_scalar(2.5)?.to_vec::<f32>()?, vec![2.5, 2.5, 3., 4.]);
    assert_eq!(a.rsub_scalar(1.0)?.to_vec::<f32>()?, vec![0., -1., -2., -3.]);
    assert_eq!(a.power_scalar(3.0)?.to_vec::<f32>()?, vec![1., 8., 27., 64.]);
    assert_eq!(a.greater_scalar(2.0)?.to_vec::<bool>()?, vec![false, false, true, true]);
    let w = where_(&a.greater_scalar(2.0)?, &a, &Array::scalar(0.0, Dtype::F32)?)?;
    assert_eq!(w.to_vec::<f32>()?, vec![0., 0., 3., 4.]);
    Ok(())
}

#[test]
fn scalars_take_the_array_dtype() -> R {
    // MLX's weak scalars: sqrt(1536) multiplies a bf16 array as bf16(39.19) = 39.25, result stays bf16.
    let x = Array::ones(&[3], Dtype::Bf16)?;
    let y = x.mul_scalar(1536f64.sqrt())?;
    assert_eq!(y.dtype(), Dtype::Bf16);
    assert_eq!(f32s(&y), vec![39.25; 3]);
    // bf16 round-to-nearest of 0.70711 is 0.70703125 (not 0.703125, a value sometimes quoted).
    assert_eq!(f32s(&Array::scalar(0.5f64.sqrt(), Dtype::Bf16)?), vec![0.707_031_25]);
    assert_eq!(f32s(&Array::scalar(2560f64.sqrt(), Dtype::Bf16)?), vec![50.5]);
    // An f32 array operand promotes instead.
    let z = x.multiply(&Array::scalar(2.0, Dtype::F32)?)?;
    assert_eq!(z.dtype(), Dtype::F32);
    Ok(())
}

#[test]
fn unary_functions() -> R {
    let x = arr(&[-1.0, 0.0, 0.5, 2.0], &[4]);
    let want = |f: fn(f64) -> f64| [-1.0f64, 0.0, 0.5, 2.0].iter().map(|&v| f(v) as f32).collect::<Vec<_>>();
    close(&f32s(&x.tanh()?), &want(f64::tanh), 1e-6);
    close(&f32s(&x.sigmoid()?), &want(|v| 1.0 / (1.0 + (-v).exp())), 1e-6);
    close(&f32s(&x.exp()?), &want(f64::exp), 1e-5);
    close(&f32s(&x.abs()?.add_scalar(1.0)?.log()?), &want(|v| (v.abs() + 1.0).ln()), 1e-6);
    close(&f32s(&x.abs()?.sqrt()?), &want(|v| v.abs().sqrt()), 1e-6);
    let g = |v: f64| 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh());
    close(&f32s(&gelu_approx(&x)?), &want(g), 1e-6);
    Ok(())
}

#[test]
fn matmul_and_shapes() -> R {
    let a = Array::arange(0.0, 6.0, 1.0, Dtype::F32)?.reshape(&[2, 3])?;
    let b = Array::arange(0.0, 6.0, 1.0, Dtype::F32)?.reshape(&[3, 2])?;
    // [[0,1,2],[3,4,5]] @ [[0,1],[2,3],[4,5]] = [[10,13],[28,40]]
    assert_eq!(a.matmul(&b)?.to_vec::<f32>()?, vec![10., 13., 28., 40.]);
    assert_eq!(a.transpose(&[1, 0])?.to_vec::<f32>()?, vec![0., 3., 1., 4., 2., 5.]);
    assert_eq!(a.swapaxes(0, 1)?.shape().unwrap(), vec![3, 2]);
    assert_eq!(a.slice(&[0, 1], &[2, 3], &[1, 1])?.to_vec::<f32>()?, vec![1., 2., 4., 5.]);
    assert_eq!(a.slice_axis(1, -1, 3)?.to_vec::<f32>()?, vec![2., 5.]);
    let c = concatenate(&[&a, &a.mul_scalar(10.0)?], 0)?;
    assert_eq!(c.shape().unwrap(), vec![4, 3]);
    assert_eq!(c.to_vec::<f32>()?[6..], [0., 10., 20., 30., 40., 50.]);
    assert_eq!(a.expand_dims(0)?.shape().unwrap(), vec![1, 2, 3]);
    assert_eq!(a.expand_dims(0)?.squeeze(0)?.shape().unwrap(), vec![2, 3]);
    assert_eq!(arr(&[1., 2.], &[2, 1]).broadcast_to(&[2, 3])?.to_vec::<f32>()?, vec![1., 1., 1., 2., 2., 2.]);
    let upd = a.slice_update(&Array::full(&[1, 2], 9.0, Dtype::F32)?, &[1, 0], &[2, 2], &[1, 1])?;
    assert_eq!(upd.to_vec::<f32>()?, vec![0., 1., 2., 9., 9., 5.]);
    Ok(())
}

#[test]
fn gathers_and_orderings() -> R {
    let table = Array::arange(0.0, 12.0, 1.0, Dtype::F32)?.reshape(&[4, 3])?;
    let ids = Array::from_slice(&[3u32, 0, 3], &[3])?;
    assert_eq!(table.take(&ids, 0)?.to_vec::<f32>()?, vec![9., 10., 11., 0., 1., 2., 9., 10., 11.]);
    let idx = Array::from_slice(&[2i32, 0, 1, 1], &[4, 1])?;
    assert_eq!(table.take_along_axis(&idx, 1)?.to_vec::<f32>()?, vec![2., 3., 7., 10.]);
    let x = arr(&[3., 1., 2., 5., 4.], &[5]);
    assert_eq!(x.sort(0)?.to_vec::<f32>()?, vec![1., 2., 3., 4., 5.]);
    assert_eq!(x.argsort(0)?.to_vec::<u32>()?, vec![1, 2, 0, 4, 3]);
    let part = x.argpartition(2, 0)?.to_vec::<u32>()?;
    let vals = [3., 1., 2., 5., 4.];
    assert!(part[..2].iter().all(|&i| vals[i as usize] <= 3.0) && vals[part[2] as usize] == 3.0);
    let put = x.put_along_axis(&Array::from_slice(&[0i32], &[1])?, &arr(&[-1.], &[1]), 0)?;
    assert_eq!(put.to_vec::<f32>()?, vec![-1., 1., 2., 5., 4.]);
    Ok(())
}

#[test]
fn reductions_and_normalisers() -> R {
    let a = arr(&[1., 2., 3., 4., 0., -1.], &[2, 3]);
    assert_eq!(a.sum(&[1], false)?.to_vec::<f32>()?, vec![6., 3.]);
    assert_eq!(a.max(&[0], false)?.to_vec::<f32>()?, vec![4., 2., 3.]);
    assert_eq!(a.min(&[1], true)?.shape().unwrap(), vec![2, 1]);
    assert_eq!(a.mean(&[0, 1], false)?.item::<f32>()?, 1.5);
    assert_eq!(a.argmax(1, false)?.to_vec::<u32>()?, vec![2, 0]);
    // argmax takes the first maximum on ties.
    assert_eq!(arr(&[1., 5., 5.], &[3]).argmax(0, false)?.item::<u32>()?, 1);
    let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln() as f32;
    close(&f32s(&a.logsumexp(&[1], false)?)[..1], &[lse], 1e-6);
    let sm = f32s(&arr(&[0., 1f32.ln(), 2f32.ln()], &[3]).softmax(&[0], false)?);
    close(&sm, &[0.25, 0.25, 0.5], 1e-6);
    assert_eq!(arr(&[1., 2., 3.], &[3]).cumsum(0, false, true)?.to_vec::<f32>()?, vec![1., 3., 6.]);
    assert_eq!(arr(&[1., 2., 3.], &[3]).cumsum(0, true, false)?.to_vec::<f32>()?, vec![5., 3., 0.]);
    Ok(())
}

#[test]
fn rms_norm_matches_formula() -> R {
    let x = arr(&[1., 2., 3., 4.], &[1, 4]);
    let w = arr(&[1., 0.5, 2., 1.], &[4]);
    let rms = ((1. + 4. + 9. + 16.) / 4.0f64 + 1e-6).sqrt();
    let want: Vec<f32> = [1., 2. * 0.5, 3. * 2., 4.].iter().map(|v| (v / rms) as f32).collect();
    close(&f32s(&fast::rms_norm(&x, Some(&w), 1e-6)?), &want, 1e-6);
    let plain: Vec<f32> = [1., 2., 3., 4.].iter().map(|v| (v / rms) as f32).collect();
    close(&f32s(&fast::rms_norm(&x, None, 1e-6)?), &plain, 1e-6);
    Ok(())
}

#[test]
fn rope_rotates_half_split_pairs() -> R {
    // Non-traditional RoPE pairs (j, j + D/2); angle = pos * base^(-2j/D).
    let d = 4;
    let x = arr(&[1., 2., 3., 4.], &[1, 1, 1, d]);
    let pos = 3;
    let got = f32s(&fast::rope(&x, d, false, RopeFreqs::Base(10000.0), 1.0, pos)?);
    let mut want = [0f32; 4];
    for j in 0..2 {
        let theta = pos as f64 * 10000f64.powf(-2.0 * j as f64 / d as f64);
        let (a, b) = ([1., 2., 3., 4.][j], [1., 2., 3., 4.][j + 2]);
        want[j] = (a * theta.cos() - b * theta.sin()) as f32;
        want[j + 2] = (a * theta.sin() + b * theta.cos()) as f32;
    }
    close(&got, &want, 1e-5);
    // Explicit wavelengths: an infinite frequency leaves its pair unrotated.
    let freqs = arr(&[1.0, f32::INFINITY], &[2]);
    let got = f32s(&fast::rope(&x, d, false, RopeFreqs::Explicit(&freqs), 1.0, pos)?);
    let t = pos as f64;
    close(&got[..], &[(1. * t.cos() - 3. * t.sin()) as f32, 2., (1. * t.sin() + 3. * t.cos()) as f32, 4.], 1e-5);
    Ok(())
}

/// softmax(q·kᵀ·scale + mask) v in f64, one head.
fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    l: usize,
    s: usize,
    d: usize,
    allow: impl Fn(usize, usize) -> bool,
) -> Vec<f32> {
    let mut out = vec![0f32; l * d];
    for i in 0..l {
        let scores: Vec<f64> = (0..s)
            .map(|j| {
                if allow(i, j) {
                    (0..d).map(|t| q[i * d + t] as f64 * k[j * d + t] as f64).sum()
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for t in 0..d {
            out[i * d + t] = (0..s).map(|j| e[j] / z * v[j * d + t] as f64).sum::<f64>() as f32;
        }
    }
    out
}

#[test]
fn sdpa_masks() -> R {
    let (l, s, d) = (2usize, 3usize, 2usize);
    let q: Vec<f32> = (0..l * d).map(|i| (i as f32 * 0.3).sin()).collect();
    let k: Vec<f32> = (0..s * d).map(|i| (i as f32 * 0.7).cos()).collect();
    let v: Vec<f32> = (0..s * d).map(|i| i as f32 * 0.1).collect();
    let (qa, ka, va) = (
        arr(&q, &[1, 1, l as i32, d as i32]),
        arr(&k, &[1, 1, s as i32, d as i32]),
        arr(&v, &[1, 1, s as i32, d as i32]),
    );
    let none = fast::scaled_dot_product_attention(&qa, &ka, &va, 1.0, Mask::None)?;
    close(&f32s(&none), &attention_ref(&q, &k, &v, l, s, d, |_, _| true), 1e-5);
    // "causal" is bottom-right aligned: query i sees keys j <= i + (s - l).
    let causal = fast::scaled_dot_product_attention(&qa, &ka, &va, 1.0, Mask::Causal)?;
    let want = attention_ref(&q, &k, &v, l, s, d, |i, j| j <= i + (s - l));
    close(&f32s(&causal), &want, 1e-5);
    let allow = |i: usize, j: usize| j != 1 || i == 1;
    let bools: Vec<bool> = (0..l * s).map(|x| allow(x / s, x % s)).collect();
    let bmask = Array::from_slice(&bools, &[l as i32, s as i32])?;
    let got = fast::scaled_dot_product_attention(&qa, &ka, &va, 1.0, Mask::Array(&bmask))?;
    close(&f32s(&got), &attention_ref(&q, &k, &v, l, s, d, allow), 1e-5);
    let add: Vec<f32> = bools.iter().map(|&b| if b { 0.0 } else { f32::NEG_INFINITY }).collect();
    let amask = arr(&add, &[l as i32, s as i32]);
    let got = fast::scaled_dot_product_attention(&qa, &ka, &va, 1.0, Mask::Array(&amask))?;
    close(&f32s(&got), &attention_ref(&q, &k, &v, l, s, d, allow), 1e-5);
    Ok(())
}

#[test]
fn quantize_round_trip_and_matmul() -> R {
    for (bits, gs) in [(4u32, 32u32), (4, 64), (8, 64), (8, 128), (4, 128)] {
        let spec = QuantSpec::new(bits, gs)?;
        let n = 256;
        let w: Vec<f32> = (0..2 * n).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
        let wa = arr(&w, &[2, n as i32]);
        let q = quant::quantize(&wa, spec)?;
        assert_eq!(q.weight.dtype(), Dtype::U32);
        assert_eq!(q.weight.shape().unwrap(), vec![2, (n as u32 * bits / 32) as i32]);
        assert_eq!(q.scales.shape().unwrap(), vec![2, (n as u32 / gs) as i32]);
        let deq = f32s(&q.dequantize()?);
        // Affine error bound: one quantization step per group. (MLX snaps the scale so the
        // group's larger-magnitude edge is exact, which can stretch the error past half a step.)
        let scales = f32s(&q.scales);
        for (i, (a, b)) in w.iter().zip(&deq).enumerate() {
            let s = scales[i / gs as usize];
            assert!((a - b).abs() <= s.abs() + 1e-6, "bits {bits} gs {gs} elem {i}: {a} vs {b} (scale {s})");
        }
        let x = arr(&(0..n).map(|i| (i as f32 * 0.01).cos()).collect::<Vec<_>>(), &[1, n as i32]);
        let y = f32s(&q.matmul_t(&x)?);
        let xv = f32s(&x);
        // One row goes through the packed row kernel: for 4 bits with 256 columns, its integer
        // path, whose 8-bit activations round each input by up to 1/254 of its block's largest.
        let tol = if quant::int8_activations(n, bits) && mlx_core::blas::row_linear_enabled() { 0.1 } else { 1e-3 };
        for r in 0..2 {
            let want: f32 = (0..n).map(|c| xv[c] * deq[r * n + c]).sum();
            assert!((y[r] - want).abs() < tol, "qmm row {r}: {} vs {want}", y[r]);
        }
        let rows = q.gather_rows(&Array::from_slice(&[1u32], &[1])?)?;
        assert_eq!(f32s(&rows), deq[n..].to_vec());
    }
    assert!(QuantSpec::new(7, 64).is_err());
    assert!(QuantSpec::new(4, 48).is_err());
    Ok(())
}

#[test]
fn quantized_nibbles_are_little_endian() -> R {
    // A linear ramp 0..31 over one group of 32 at 4 bits: word 0 holds elements 0..7, element 0
    // in the lowest nibble (docs/numerics.md, "MLX affine quantization").
    let w = Array::arange(0.0, 32.0, 1.0, Dtype::F32)?.reshape(&[1, 32])?;
    let q = quant::quantize(&w, QuantSpec::new(4, 32)?)?;
    let words = q.weight.to_vec::<u32>()?;
    let scale = q.scales.item::<f32>()?;
    let bias = q.biases.item::<f32>()?;
    let nibble = |k: usize| (words[k / 8] >> (4 * (k % 8))) & 0xf;
    for k in 0..32 {
        let v = scale * nibble(k) as f32 + bias;
        assert!((v - k as f32).abs() <= scale.abs() + 1e-5, "element {k}: {v}");
    }
    // Monotone codes along the ramp, in the direction of the scale's sign.
    let codes: Vec<u32> = (0..32).map(nibble).collect();
    assert!(codes.windows(2).all(|w| if scale > 0.0 { w[0] <= w[1] } else { w[0] >= w[1] }), "{codes:?}");
    assert_ne!(codes[0], codes[31]);
    Ok(())
}

#[test]
fn random_is_deterministic_per_key() -> R {
    let k = random::key(42)?;
    let a = random::uniform(0.0, 1.0, &[1000], Dtype::F32, &k)?.to_vec::<f32>()?;
    let b = random::uniform(0.0, 1.0, &[1000], Dtype::F32, &k)?.to_vec::<f32>()?;
    assert_eq!(a, b);
    assert!(a.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = a.iter().sum::<f32>() / 1000.0;
    assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
    let (k1, k2) = random::split(&k)?;
    assert_ne!(k1.to_vec::<u32>()?, k2.to_vec::<u32>()?);
    let mut chain = random::KeyChain::new(42)?;
    assert_eq!(chain.next_key()?.to_vec::<u32>()?, k2.to_vec::<u32>()?);
    // Categorical over near-certain logits.
    let logits = arr(&[-100., 10., -100.], &[1, 3]);
    let keys = random::split_n(&k, 20)?;
    for key in keys {
        assert_eq!(random::categorical(&logits, -1, &key)?.item::<u32>()?, 1);
    }
    // And frequencies follow the probabilities.
    let logits = arr(&[0.0, 3f32.ln()], &[1, 2]).broadcast_to(&[4000, 2])?;
    let draws = random::categorical(&logits, -1, &random::key(7)?)?.to_vec::<u32>()?;
    let ones = draws.iter().filter(|&&d| d == 1).count() as f32 / 4000.0;
    assert!((ones - 0.75).abs() < 0.03, "P(1) = {ones}");
    Ok(())
}

#[test]
fn safetensors_round_trip_is_exact_for_bf16() -> R {
    let dir = std::env::temp_dir().join(format!("mlx-core-io-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.safetensors");
    let bits: Vec<u16> = (0..64u16).map(|i| i.wrapping_mul(2654).wrapping_add(0x3f00)).collect();
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let a = Array::from_bytes(&bytes, &[8, 8], Dtype::Bf16)?;
    let i = Array::from_slice(&[1u32, 2, 3], &[3])?;
    let meta = [("format".to_string(), "mlx".to_string())].into_iter().collect();
    mlx_core::save_safetensors(&path, [("a", &a), ("ids", &i)], &meta)?;
    let f = mlx_core::load_safetensors(&path)?;
    assert_eq!(f.tensors["a"].dtype(), Dtype::Bf16);
    assert_eq!(f.tensors["a"].to_bytes()?, bytes);
    assert_eq!(f.tensors["ids"].to_vec::<u32>()?, vec![1, 2, 3]);
    assert_eq!(f.metadata.get("format").map(String::as_str), Some("mlx"));
    // No temporary files are left behind.
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 1, "{left:?}");
    let missing = mlx_core::load_safetensors(&dir.join("nope.safetensors")).unwrap_err();
    assert!(missing.to_string().contains("nope.safetensors"), "{missing}");
    std::fs::write(dir.join("bad.safetensors"), b"not a safetensors file").unwrap();
    let bad = mlx_core::load_safetensors(&dir.join("bad.safetensors")).unwrap_err();
    assert!(bad.to_string().contains("bad.safetensors"), "{bad}");
    std::fs::remove_dir_all(&dir).unwrap();
    Ok(())
}

#[test]
fn mlx_exceptions_become_errors_naming_the_op() {
    let a = Array::zeros(&[2, 3], Dtype::F32).unwrap();
    let b = Array::zeros(&[4, 5], Dtype::F32).unwrap();
    let e = a.matmul(&b).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Mlx { op: "matmul", .. }), "{msg}");
    assert!(msg.contains("ops.rs"), "location should point at the caller: {msg}");
    let e = a.reshape(&[7]).unwrap_err();
    assert!(e.to_string().contains("reshape"), "{e}");
    let e = Array::from_slice(&[1.0f32, 2.0], &[3]).unwrap_err();
    assert!(e.to_string().contains("from_bytes"), "{e}");
    assert!(matches!(a.to_vec::<u32>(), Err(Error::Dtype { .. })));
}

#[test]
fn clone_shares_and_drop_frees() -> R {
    let a = Array::arange(0.0, 4.0, 1.0, Dtype::F32)?;
    let b = a.clone();
    drop(a);
    assert_eq!(b.to_vec::<f32>()?, vec![0., 1., 2., 3.]);
    assert_eq!(mlx_core::MLX_VERSION, "0.32.4");
    assert!(mlx_core::mlx_version().starts_with("0.32.4"));
    Ok(())
}

#[test]
fn streams_queue_work_apart_from_the_default() -> R {
    use mlx_core::{Device, Stream};
    let original = Stream::default_for(Device::Cpu)?;
    let side = Stream::new(Device::Cpu)?;
    assert_ne!(side, original, "a new stream is a different queue");
    assert_eq!(side.device(), Device::Cpu);
    side.set_default()?;
    assert_eq!(Stream::default_for(Device::Cpu)?, side);
    let a = arr(&[1.0, 2.0], &[2]).mul_scalar(3.0)?;
    a.eval()?;
    side.synchronize()?;
    original.set_default()?;
    assert_eq!(Stream::default_for(Device::Cpu)?, original);
    assert_eq!(f32s(&a), vec![3.0, 6.0], "work queued on the side stream ran");
    Ok(())
}

/// Few-row f32 products go through `blas::row_linear`, whose rows are batch-invariant by
/// construction; the BLAS's own behaviour is a diagnostic (`dspark doctor`), and it must tell
/// the truth. Where the probe found a padding (`blas::row_quantum_probe`), rows padded to it
/// have the bits of the same rows in a batch of 64, at the sizes real checkpoints use and for
/// both operand layouts (`x @ W` and `x @ Wᵀ` as `nn.Linear` does); where it found none, some
/// row here does depend on its batch.
#[test]
fn the_blas_row_quantum_probe_tells_the_truth() {
    let probe = mlx_core::blas::row_quantum_probe();
    let q = probe.unwrap_or(1);
    let (mut unpadded_differs, mut padded_differs) = (false, None);
    for &(k, n) in &[(128usize, 512usize), (1024, 4096), (2560, 10240), (1024, 32768)] {
        let key = random::key(k as u64).unwrap();
        let w = random::normal(&[k as i32, n as i32], Dtype::F32, 0.0, 0.05, &key).unwrap();
        let wt = w.transpose(&[1, 0]).unwrap().contiguous().unwrap().transpose(&[1, 0]).unwrap();
        let x = random::normal(&[64, k as i32], Dtype::F32, 0.0, 1.0, &key).unwrap();
        for weights in [&w, &wt] {
            let canon = x.matmul(weights).unwrap();
            for rows in [1usize, 2, 3, 5, 8, 9, 16, 17] {
                let start = 3;
                let xs = x.slice_axis(0, start, start + rows as i32).unwrap();
                let got = mlx_core::blas::pad_rows(&xs, q).unwrap().matmul(weights).unwrap();
                let plain = xs.matmul(weights).unwrap();
                unpadded_differs |= plain.to_bytes().unwrap()
                    != canon.slice_axis(0, start, start + rows as i32).unwrap().to_bytes().unwrap();
                for r in 0..rows as i32 {
                    let one = got.slice_axis(0, r, r + 1).unwrap().to_bytes().unwrap();
                    let want = canon.slice_axis(0, start + r, start + r + 1).unwrap().to_bytes().unwrap();
                    if one != want && padded_differs.is_none() {
                        padded_differs = Some(format!("[{rows}, {k}] @ [{k}, {n}] padded to {q}: row {r}"));
                    }
                }
            }
        }
    }
    let blas = mlx_core::blas::linked();
    match probe {
        Some(q) => {
            assert_eq!(padded_differs, None, "probe says a multiple of {q} rows is batch-invariant (BLAS {blas:?})");
            // The quantum is the smallest padding that works: above 1, unpadded rows differ.
            assert_eq!(unpadded_differs, q > 1, "row quantum {q} but unpadded rows differ: {unpadded_differs}");
        }
        None => assert!(unpadded_differs, "probe says rows depend on their batch, but none did here (BLAS {blas:?})"),
    }
}

/// The few-row f32 kernel: every row's bits are the same whatever the row count and the row's
/// place, without padding, and the values are the matmul's up to rounding.
#[test]
fn row_linear_rows_are_batch_invariant_and_correct() {
    for &(k, n) in &[(1usize, 3usize), (13, 9), (128, 512), (1024, 4096), (1000, 1030)] {
        let key = random::key(7 + k as u64).unwrap();
        let w = random::normal(&[n as i32, k as i32], Dtype::F32, 0.0, 0.05, &key).unwrap(); // [N, K]
        let x = random::normal(&[40, k as i32], Dtype::F32, 0.0, 1.0, &key).unwrap();
        let all = mlx_core::blas::row_linear(&x, &w).unwrap();
        let reference = x.matmul(&w.transpose(&[1, 0]).unwrap()).unwrap();
        let (a, r) = (f32s(&all), f32s(&reference));
        let max = a.iter().zip(&r).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
        assert!(max < 1e-4 * (k as f32).sqrt().max(1.0), "[40, {k}] x [{n}, {k}]ᵀ differs from matmul by {max}");
        for (start, rows) in [(0, 1), (5, 1), (3, 2), (2, 3), (7, 5), (9, 7), (0, 8), (11, 9), (20, 17)] {
            let part = mlx_core::blas::row_linear(&x.slice_axis(0, start, start + rows).unwrap(), &w).unwrap();
            let want = all.slice_axis(0, start, start + rows).unwrap();
            assert_eq!(part.to_bytes().unwrap(), want.to_bytes().unwrap(), "k {k} n {n}: rows {start}..+{rows}");
        }
    }
    // A transposed view is made contiguous first; a wrong inner size is refused.
    let w = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let x = Array::from_slice(&[1.0f32, 1.0], &[1, 2]).unwrap();
    assert_eq!(f32s(&mlx_core::blas::row_linear(&x, &w.transpose(&[1, 0]).unwrap()).unwrap()), vec![4.0, 6.0]);
    assert!(mlx_core::blas::row_linear(&x, &Array::zeros(&[2, 3], Dtype::F32).unwrap()).is_err());
}

/// The AVX-512 form of the few-row kernel (two weight rows per register, up to eight input rows
/// per pass) gives the AVX2 form's bits: tiles of 1..8 rows and more, K with a tail past the
/// last multiple of 8, N with weight rows left over after blocks of 4. On a machine without
/// AVX-512 only the AVX2 form runs and there is nothing to compare.
#[test]
fn row_linear_avx512_gives_the_avx2_bits() {
    let isa = mlx_core::blas::row_linear_isa();
    assert!(["avx512", "avx2", "generic"].contains(&isa.as_str()), "{isa}");
    for (m, k, n) in [(1, 1024, 8), (3, 1027, 13), (8, 64, 4), (9, 5, 7), (17, 1024, 6), (64, 300, 9), (5, 3, 2)] {
        assert!(mlx_core::blas::row_linear_paths_agree(m, k, n), "{isa}: [{m}, {k}] x [{n}, {k}] differ");
    }
}

/// The vectorized gelu_approx: within a few ulp of MLX's composed form over a wide range
/// (tails, zero, large magnitudes), and each element's bits are its own: alone, at the tail of
/// an odd length, or inside a long array.
#[test]
fn row_gelu_matches_gelu_approx_and_is_elementwise() {
    let key = random::key(5).unwrap();
    let x = random::normal(&[3, 37], Dtype::F32, 0.0, 4.0, &key).unwrap();
    let extremes = Array::from_slice(&[0.0f32, -0.0, 1e-8, -1e-8, 30.0, -30.0, 1e4, -1e4, 0.5], &[1, 9]).unwrap();
    for x in [x, extremes] {
        let fast = f32s(&mlx_core::blas::row_gelu(&x).unwrap());
        let want = f32s(&gelu_approx(&x).unwrap());
        for ((f, w), v) in fast.iter().zip(&want).zip(f32s(&x)) {
            assert!((f - w).abs() <= 4e-7 * w.abs().max(1e-3) + 1e-9, "gelu({v}) = {f}, MLX gives {w}");
        }
        let flat = x.reshape(&[-1]).unwrap();
        for i in 0..flat.dim(0).unwrap() {
            let one = mlx_core::blas::row_gelu(&flat.slice_axis(0, i, i + 1).unwrap()).unwrap();
            assert_eq!(f32s(&one)[0].to_bits(), fast[i as usize].to_bits(), "element {i}");
        }
    }
    assert!(mlx_core::blas::row_gelu(&Array::zeros(&[2], Dtype::Bf16).unwrap()).is_err());
    // Its gradient is gelu_approx's.
    let x = random::normal(&[2, 5], Dtype::F32, 0.0, 2.0, &key).unwrap();
    let grad = |f: fn(&Array) -> mlx_core::Result<Array>| {
        let (_, g) =
            mlx_core::value_and_grad::<Error>(|p| Ok(vec![f(&p[0])?.sum_all()?]), std::slice::from_ref(&x), &[0])
                .unwrap();
        f32s(&g[0])
    };
    let (a, b) = (grad(mlx_core::blas::row_gelu), grad(gelu_approx));
    assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-5), "{a:?} vs {b:?}");
}

/// Row attention: each row is MLX's attention over its own keys up to rounding, and its bits
/// do not depend on which other rows share the call (grouped queries, rows of other lengths).
#[test]
fn row_attention_rows_are_batch_invariant_and_correct() {
    let key = random::key(3).unwrap();
    let (b, hq, d) = (1, 4, 24);
    for hkv in [1, 2, 4] {
        let q = random::normal(&[b, hq, 5, d], Dtype::F32, 0.0, 1.0, &key).unwrap(); // [B, Hq, n, D]
        let kv = |l: i32, seed: u64| {
            let k = random::normal(&[b, hkv, l, d], Dtype::F32, 0.0, 1.0, &random::key(seed).unwrap()).unwrap();
            let v = random::normal(&[b, hkv, l, d], Dtype::F32, 0.0, 1.0, &random::key(seed + 100).unwrap()).unwrap();
            (k, v)
        };
        let rows: Vec<(Array, Array)> =
            [(9, 11), (10, 12), (1, 13), (33, 14), (17, 15)].iter().map(|&(l, s)| kv(l, s)).collect();
        let all = mlx_core::blas::row_attention(&q, &rows, 0.5).unwrap();
        assert_eq!(all.shape().unwrap(), vec![b, hq, 5, d]);
        for (i, (k, v)) in rows.iter().enumerate() {
            let qi = q.slice_axis(2, i as i32, i as i32 + 1).unwrap();
            let want = fast::scaled_dot_product_attention(&qi, k, v, 0.5, Mask::None).unwrap();
            let got = all.slice_axis(2, i as i32, i as i32 + 1).unwrap();
            let max = f32s(&got).iter().zip(f32s(&want)).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(max < 1e-5, "hkv {hkv} row {i}: differs from sdpa by {max}");
            let alone = mlx_core::blas::row_attention(&qi, &rows[i..i + 1], 0.5).unwrap();
            assert_eq!(alone.to_bytes().unwrap(), got.contiguous().unwrap().to_bytes().unwrap(), "hkv {hkv} row {i}");
        }
    }
    // Keys and values given as views (a cache buffer cut to its first rows, heads interleaved
    // by a transpose, rows not contiguous at all) give the bits of their row-major copies.
    let q = random::normal(&[1, 4, 3, d], Dtype::F32, 0.0, 1.0, &key).unwrap();
    let buf = random::normal(&[1, 2, 40, d], Dtype::F32, 0.0, 1.0, &random::key(21).unwrap()).unwrap();
    let by_rows = random::normal(&[1, 40, 2, d], Dtype::F32, 0.0, 1.0, &random::key(22).unwrap()).unwrap();
    let by_dims = random::normal(&[1, 2, d, 40], Dtype::F32, 0.0, 1.0, &random::key(23).unwrap()).unwrap();
    let views = vec![
        (buf.slice_axis(2, 0, 27).unwrap(), buf.slice_axis(2, 3, 30).unwrap()),
        (by_rows.transpose(&[0, 2, 1, 3]).unwrap().slice_axis(2, 0, 12).unwrap(), buf.slice_axis(2, 0, 12).unwrap()),
        (by_dims.transpose(&[0, 1, 3, 2]).unwrap().slice_axis(2, 0, 5).unwrap(), buf.slice_axis(2, 1, 6).unwrap()),
    ];
    let copies: Vec<(Array, Array)> =
        views.iter().map(|(k, v)| (k.contiguous().unwrap(), v.contiguous().unwrap())).collect();
    for (k, v) in &copies {
        mlx_core::eval(&[k, v]).unwrap();
    }
    let from_views = mlx_core::blas::row_attention(&q, &views, 0.3).unwrap();
    let from_copies = mlx_core::blas::row_attention(&q, &copies, 0.3).unwrap();
    assert_eq!(from_views.to_bytes().unwrap(), from_copies.to_bytes().unwrap(), "views read in place");
    // Keys in pieces give the bits of their concatenation (a wrapped ring's two halves).
    let pieces: Vec<Vec<(Array, Array)>> = vec![
        vec![(buf.slice_axis(2, 30, 40).unwrap(), buf.slice_axis(2, 0, 10).unwrap())],
        vec![
            (buf.slice_axis(2, 30, 40).unwrap(), buf.slice_axis(2, 0, 10).unwrap()),
            (buf.slice_axis(2, 0, 20).unwrap(), buf.slice_axis(2, 10, 30).unwrap()),
        ],
        vec![
            (by_dims.transpose(&[0, 1, 3, 2]).unwrap().slice_axis(2, 0, 3).unwrap(), buf.slice_axis(2, 1, 4).unwrap()),
            (buf.slice_axis(2, 5, 6).unwrap(), buf.slice_axis(2, 6, 7).unwrap()),
        ],
    ];
    let joined: Vec<(Array, Array)> = pieces
        .iter()
        .map(|r| {
            let ks: Vec<&Array> = r.iter().map(|(k, _)| k).collect();
            let vs: Vec<&Array> = r.iter().map(|(_, v)| v).collect();
            (concatenate(&ks, 2).unwrap(), concatenate(&vs, 2).unwrap())
        })
        .collect();
    let from_pieces = mlx_core::blas::row_attention_pieces(&q, &pieces, 0.3).unwrap();
    let from_joined = mlx_core::blas::row_attention(&q, &joined, 0.3).unwrap();
    assert_eq!(from_pieces.to_bytes().unwrap(), from_joined.to_bytes().unwrap(), "pieces read as one row");
    assert!(mlx_core::blas::row_attention_pieces(&q, &pieces[..2], 0.3).is_err(), "3 rows, 2 lists");
    assert!(
        mlx_core::blas::row_attention_pieces(&q, &[vec![], pieces[1].clone(), pieces[2].clone()], 0.3).is_err(),
        "a row without keys"
    );
    // Inputs that do not fit are refused, not read out of bounds.
    let q = Array::zeros(&[1, 4, 2, 8], Dtype::F32).unwrap();
    let k = Array::zeros(&[1, 1, 3, 8], Dtype::F32).unwrap();
    assert!(mlx_core::blas::row_attention(&q, &[(k.clone(), k.clone())], 1.0).is_err(), "2 rows, 1 pair");
    let k3 = Array::zeros(&[1, 3, 3, 8], Dtype::F32).unwrap();
    assert!(mlx_core::blas::row_attention(&q, &[(k3.clone(), k3.clone()), (k3.clone(), k3)], 1.0).is_err(), "3 ∤ 4");
    let short = Array::zeros(&[1, 1, 2, 8], Dtype::F32).unwrap();
    assert!(mlx_core::blas::row_attention(&q, &[(k.clone(), short), (k.clone(), k)], 1.0).is_err(), "k/v lengths");
}

#[test]
fn row_draw_follows_the_running_sum() {
    use mlx_core::row_sample::{draw, draw_residual, probabilities, RowFilter};
    let w = Array::from_slice(&[0.0f32, 1.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0], &[2, 4]).unwrap();
    let draws = |u: [f32; 2]| draw(&w, &Array::from_slice(&u, &[2]).unwrap()).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(draws([0.0, 0.5]), vec![1, 0], "u = 0 takes the first positive weight; an all-zero row gives 0");
    assert_eq!(draws([0.24, 0.0]), vec![1, 0]);
    assert_eq!(draws([0.25, 0.0]), vec![3, 0], "1/4 of the mass sits on token 1");
    assert_eq!(draws([0.999_999_9, 0.0]), vec![3, 0], "never a zero-weight token past the last positive");
    // A residual: p − q keeps token 2 only; where p ≤ q everywhere, p itself.
    let p = Array::from_slice(&[0.25f32, 0.25, 0.5, 0.0, 0.5, 0.5, 0.0, 0.0], &[2, 4]).unwrap();
    let q = Array::from_slice(&[0.5f32, 0.25, 0.25, 0.0, 0.5, 0.5, 0.0, 0.0], &[2, 4]).unwrap();
    let u = Array::from_slice(&[0.0f32, 0.9], &[2]).unwrap();
    assert_eq!(draw_residual(&p, &q, &u, 1e-6).unwrap().to_vec::<u32>().unwrap(), vec![2, 1]);
    // Bad shapes are refused.
    assert!(draw(&w, &Array::from_slice(&[0.5f32], &[1]).unwrap()).is_err(), "one u per row");
    let f = RowFilter { temperature: 1.0, top_p: 0.0, min_p: 0.0, min_keep: 1, top_k: 0 };
    assert!(probabilities(&Array::zeros(&[4], Dtype::F32).unwrap(), &f).is_err(), "[R, V] expected");
    assert!(probabilities(&Array::zeros(&[1, 4], Dtype::Bf16).unwrap(), &f).is_err(), "f32 only");
    // Filters: top-k 2 of [1, 3, 2, 0] at T = 1 keeps tokens 1 and 2 in the ratio e : 1.
    let l = Array::from_slice(&[1.0f32, 3.0, 2.0, 0.0], &[1, 4]).unwrap();
    let got = probabilities(&l, &RowFilter { top_k: 2, ..f }).unwrap().to_f32_vec().unwrap();
    let e = std::f32::consts::E;
    let want = [0.0, e / (e + 1.0), 1.0 / (e + 1.0), 0.0];
    assert!(got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6), "{got:?}");
}

#[test]
fn row_softcap_matches_the_composed_softcap() {
    let x = random::normal(&[3, 1000], Dtype::F32, 0.0, 40.0, &random::key(5).unwrap()).unwrap();
    let extremes = Array::from_slice(&[0.0f32, -0.0, 1e-30, -1e-30, 1e4, -1e4, 29.9, -300.0, 88.0], &[1, 9]).unwrap();
    for x in [x, extremes] {
        let got = f32s(&mlx_core::blas::row_softcap(&x, 30.0).unwrap());
        let want = f32s(&x.div_scalar(30.0).unwrap().tanh().unwrap().mul_scalar(30.0).unwrap());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 4e-6 * w.abs().max(1e-3), "{g} vs {w}");
        }
    }
    // Elementwise: a value's bits are the same alone as inside a row.
    let row = random::normal(&[1, 37], Dtype::F32, 0.0, 40.0, &random::key(6).unwrap()).unwrap();
    let all = f32s(&mlx_core::blas::row_softcap(&row, 30.0).unwrap());
    for i in [0, 8, 36] {
        let one = row.slice_axis(1, i, i + 1).unwrap();
        assert_eq!(f32s(&mlx_core::blas::row_softcap(&one, 30.0).unwrap())[0].to_bits(), all[i as usize].to_bits());
    }
    assert!(mlx_core::blas::row_softcap(&row, 0.0).is_err(), "a cap must be positive");
    // The gradient is 1 − tanh²(x / cap).
    let x = Array::from_slice(&[0.0f32, 15.0, -45.0], &[3]).unwrap();
    let f = |p: &[Array]| -> mlx_core::Result<Vec<Array>> {
        Ok(vec![mlx_core::blas::row_softcap(&p[0], 30.0)?.sum(&[0], false)?])
    };
    let g = mlx_core::value_and_grad(f, std::slice::from_ref(&x), &[0]).unwrap().1;
    let want: Vec<f32> = [0.0f32, 15.0, -45.0].iter().map(|v| 1.0 - (v / 30.0).tanh().powi(2)).collect();
    for (a, b) in f32s(&g[0]).iter().zip(&want) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

/// OpenBLAS names the kernels it chose exactly when it is the BLAS linked in.
#[test]
fn the_openblas_kernels_are_named_when_openblas_is_linked() {
    let openblas = mlx_core::blas::linked().is_some_and(|p| p.contains("openblas"));
    let core = mlx_core::blas::openblas_core();
    assert_eq!(core.is_some(), openblas, "linked {:?}, kernels {core:?}", mlx_core::blas::linked());
    if let Some(why) = mlx_core::blas::openblas_fallback() {
        assert!(why.contains(&core.unwrap_or_default()) && why.contains("OPENBLAS_CORETYPE="), "{why}");
    }
}

/// Sampling's log-probabilities as one row node: MLX's `x − logsumexp(x)` up to a few ulp of
/// the exp, masked (−inf) logits kept, every row's bits its own whatever the batch, and the
/// AVX2 and portable sums identical.
#[test]
fn row_log_softmax_matches_the_composed_form_and_rows_are_their_own() {
    let x = random::normal(&[4, 4099], Dtype::F32, 0.0, 6.0, &random::key(8).unwrap()).unwrap();
    let masked =
        Array::from_slice(&[f32::NEG_INFINITY, 3.0, -1e4, 0.5, f32::NEG_INFINITY, 88.0, -88.0], &[1, 7]).unwrap();
    for x in [x, masked] {
        let got = f32s(&mlx_core::blas::row_log_softmax(&x).unwrap());
        let want = f32s(&x.subtract(&x.logsumexp(&[-1], true).unwrap()).unwrap());
        for (g, w) in got.iter().zip(&want) {
            assert!(g == w || (g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
        }
    }
    let rows = random::normal(&[5, 300], Dtype::F32, 0.0, 6.0, &random::key(9).unwrap()).unwrap();
    let all = f32s(&mlx_core::blas::row_log_softmax(&rows).unwrap());
    for r in [0, 3, 4] {
        let one = f32s(&mlx_core::blas::row_log_softmax(&rows.slice_axis(0, r, r + 1).unwrap()).unwrap());
        let part = &all[r as usize * 300..(r as usize + 1) * 300];
        assert!(one.iter().zip(part).all(|(a, b)| a.to_bits() == b.to_bits()), "row {r} differs alone");
    }
    for n in [1, 7, 8, 9, 300, 4096, 4099] {
        assert!(mlx_core::blas::row_log_softmax_paths_agree(n), "AVX2 and portable sums differ at n = {n}");
    }
}
