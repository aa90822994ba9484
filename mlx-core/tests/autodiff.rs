//! Gradients through MLX's `value_and_grad` against central finite differences (f32), for every
//! op a training loss is built from, plus the error paths of the Rust closure.

use mlx_core::fast::{self, Mask, RopeFreqs};
use mlx_core::random::KeyChain;
use mlx_core::{value_and_grad, vjp, where_, Array, Dtype, Error, Result};

/// A scalar loss of `inputs`.
type Loss = dyn Fn(&[Array]) -> Result<Array>;

fn scalar(a: &Array) -> f64 {
    f64::from(a.to_f32_vec().unwrap()[0])
}

/// Checks d loss / d inputs[i] for every i in `argnums` against finite differences of the loss,
/// along two directions: the gradient itself (the directional derivative is then ‖g‖, as large
/// as it gets, so f32 rounding cannot hide a wrong magnitude) and a random one (which catches
/// a wrong direction), each error relative to ‖g‖·‖v‖.
fn check(name: &str, loss: &Loss, inputs: Vec<Array>, argnums: &[usize]) {
    let (values, grads) = value_and_grad(|xs: &[Array]| Ok::<_, Error>(vec![loss(xs)?]), &inputs, argnums).unwrap();
    let l0 = scalar(&values[0]);
    assert!(l0.is_finite(), "{name}: loss {l0}");
    let mut keys = KeyChain::new(0xfd).unwrap();
    let norm = |a: &Array| scalar(&a.square().unwrap().sum_all().unwrap()).sqrt();
    for (&i, g) in argnums.iter().zip(&grads) {
        assert_eq!(g.shape().unwrap(), inputs[i].shape().unwrap(), "{name}: gradient shape of input {i}");
        let random =
            mlx_core::random::normal(&inputs[i].shape().unwrap(), Dtype::F32, 0.0, 1.0, &keys.next_key().unwrap())
                .unwrap();
        let along_g = g.div_scalar(norm(g).max(1e-12)).unwrap();
        for (what, v) in [("gradient", along_g), ("random", random)] {
            let analytic = scalar(&g.multiply(&v).unwrap().sum_all().unwrap());
            let at = |step: f64| {
                let mut xs = inputs.clone();
                xs[i] = inputs[i].add(&v.mul_scalar(step).unwrap()).unwrap();
                scalar(&loss(&xs).unwrap())
            };
            let central = |h: f64| (at(h) - at(-h)) / (2.0 * h);
            // Richardson extrapolation of two central differences: O(h⁴) truncation, so h can
            // stay large enough for f32 rounding not to matter.
            let numeric = (4.0 * central(1e-2) - central(2e-2)) / 3.0;
            let rel = (analytic - numeric).abs() / (norm(g) * norm(&v)).max(1e-6);
            assert!(
                rel < 1e-3,
                "{name}, input {i}, {what} direction: analytic {analytic} vs numeric {numeric} (rel {rel:.2e})"
            );
        }
    }
}

fn randn(keys: &mut KeyChain, shape: &[i32], scale: f32) -> Array {
    mlx_core::random::normal(shape, Dtype::F32, 0.0, scale, &keys.next_key().unwrap()).unwrap()
}

/// Σ w ⊙ y with a random w fixed by `seed`, so every output element matters differently.
fn weighted(y: &Array, seed: u64) -> Result<Array> {
    let w = mlx_core::random::normal(&y.shape().unwrap(), Dtype::F32, 0.0, 1.0, &mlx_core::random::key(seed)?)?;
    y.multiply(&w)?.sum_all()
}

#[test]
fn matmul_and_linear() {
    let mut k = KeyChain::new(1).unwrap();
    let w_out = randn(&mut k, &[3, 5], 1.0);
    let loss = move |xs: &[Array]| -> Result<Array> {
        // x @ Wᵀ + b, as a linear layer computes it.
        let y = xs[0].matmul(&xs[1].transpose(&[1, 0])?)?.add(&xs[2])?;
        y.multiply(&w_out)?.sum_all()
    };
    check(
        "linear",
        &loss,
        vec![randn(&mut k, &[3, 4], 1.0), randn(&mut k, &[5, 4], 0.5), randn(&mut k, &[5], 1.0)],
        &[0, 1, 2],
    );
}

#[test]
fn rms_norm() {
    let mut k = KeyChain::new(2).unwrap();
    let loss = move |xs: &[Array]| weighted(&fast::rms_norm(&xs[0], Some(&xs[1]), 1e-6)?, 99);
    check("rms_norm", &loss, vec![randn(&mut k, &[2, 3, 8], 1.0), randn(&mut k, &[8], 1.0)], &[0, 1]);
}

/// The row node `mlx_core::blas::rms_norm` picks on the CPU (any row count, so training
/// losses go through it): its gradient comes from MLX's form.
#[test]
fn row_rms_norm() {
    let mut k = KeyChain::new(3).unwrap();
    let loss = move |xs: &[Array]| weighted(&mlx_core::blas::rms_norm(&xs[0], Some(&xs[1]), 1e-6)?, 99);
    check("row rms_norm", &loss, vec![randn(&mut k, &[2, 3, 8], 1.0), randn(&mut k, &[8], 1.0)], &[0, 1]);
    let unweighted = move |xs: &[Array]| weighted(&mlx_core::blas::rms_norm(&xs[0], None, 1e-6)?, 98);
    check("row rms_norm without weight", &unweighted, vec![randn(&mut k, &[4, 16], 1.0)], &[0]);
}

#[test]
fn rope() {
    let mut k = KeyChain::new(3).unwrap();
    let loss = move |xs: &[Array]| weighted(&fast::rope(&xs[0], 8, false, RopeFreqs::Base(10000.0), 1.0, 3)?, 99);
    // [B, H, L, D]; partial rotation (8 of 16 dims) as Gemma's full-attention layers use.
    check("rope", &loss, vec![randn(&mut k, &[1, 2, 4, 16], 1.0)], &[0]);
}

#[test]
fn attention_with_a_mask() {
    let mut k = KeyChain::new(4).unwrap();
    // A bool mask (true = attend) that hides the first key from every query but the last.
    let mask_rows: Vec<bool> = (0..4).flat_map(|q| (0..6).map(move |s| s > 0 || q == 3)).collect();
    let mask = Array::from_slice(&mask_rows, &[4, 6]).unwrap();
    let loss = move |xs: &[Array]| {
        let a = fast::scaled_dot_product_attention(&xs[0], &xs[1], &xs[2], 0.5, Mask::Array(&mask))?;
        weighted(&a, 99)
    };
    let (q, kk, v) =
        (randn(&mut k, &[1, 2, 4, 8], 1.0), randn(&mut k, &[1, 1, 6, 8], 1.0), randn(&mut k, &[1, 1, 6, 8], 1.0));
    check("sdpa (GQA, bool mask)", &loss, vec![q, kk, v], &[0, 1, 2]);
}

#[test]
fn softmax_logsumexp_sigmoid_abs_clip_where() {
    let mut k = KeyChain::new(5).unwrap();
    let cases: Vec<(&str, Box<Loss>)> = vec![
        ("softmax", Box::new(move |xs: &[Array]| weighted(&xs[0].softmax(&[-1], true)?, 99))),
        ("logsumexp", Box::new(move |xs: &[Array]| weighted(&xs[0].logsumexp(&[-1], false)?, 99))),
        ("log-softmax", Box::new(move |xs: &[Array]| weighted(&xs[0].subtract(&xs[0].logsumexp(&[-1], true)?)?, 99))),
        ("sigmoid", Box::new(move |xs: &[Array]| weighted(&xs[0].sigmoid()?, 99))),
        // |x| and clip away from their kinks (inputs are shifted off 0 and off ±1 below).
        ("abs", Box::new(move |xs: &[Array]| weighted(&xs[0].abs()?, 99))),
        ("clip", Box::new(move |xs: &[Array]| weighted(&xs[0].maximum_scalar(-1.0)?.minimum_scalar(1.0)?, 99))),
        (
            "where",
            Box::new(move |xs: &[Array]| {
                let c = xs[0].greater_scalar(0.0)?.stop_gradient()?;
                weighted(&where_(&c, &xs[0].square()?, &xs[0].mul_scalar(3.0)?)?, 99)
            }),
        ),
    ];
    // Values in (0.1, 0.9) ∪ (1.1, 1.9) in magnitude: no kink within h of any of them.
    let base = randn(&mut k, &[3, 7], 1.0);
    let x = base.abs().unwrap().minimum_scalar(0.8).unwrap().add_scalar(0.1).unwrap();
    let sign = base.greater_scalar(0.0).unwrap();
    let x = where_(&sign, &x, &x.negative().unwrap()).unwrap();
    for (name, loss) in &cases {
        check(name, loss.as_ref(), vec![x.clone()], &[0]);
    }
}

#[test]
fn take_and_gather_along_an_axis() {
    let mut k = KeyChain::new(6).unwrap();
    let ids = Array::from_slice(&[3u32, 0, 3, 1], &[4]).unwrap();
    let idx = Array::from_slice(&[2u32, 0, 4], &[3, 1]).unwrap();
    let take = move |xs: &[Array]| weighted(&xs[0].take(&ids, 0)?, 99);
    check("take (embedding rows, repeated id)", &take, vec![randn(&mut k, &[5, 6], 1.0)], &[0]);
    let along = move |xs: &[Array]| weighted(&xs[0].take_along_axis(&idx, -1)?, 98);
    check("take_along_axis", &along, vec![randn(&mut k, &[3, 5], 1.0)], &[0]);
}

#[test]
fn cross_entropy_loss() {
    let mut k = KeyChain::new(7).unwrap();
    let targets = Array::from_slice(&[1u32, 4, 0, 2], &[4, 1]).unwrap();
    // Mean next-token cross-entropy of a tiny linear model: logsumexp − logit[target].
    let loss = move |xs: &[Array]| -> Result<Array> {
        let logits = xs[0].matmul(&xs[1])?; // [4, 5]
        let picked = logits.take_along_axis(&targets, -1)?.squeeze(-1)?;
        logits.logsumexp(&[-1], false)?.subtract(&picked)?.mean_all()
    };
    check("cross-entropy", &loss, vec![randn(&mut k, &[4, 8], 1.0), randn(&mut k, &[8, 5], 0.5)], &[0, 1]);
}

#[test]
fn gradients_come_back_in_the_callers_order_and_values_are_kept() {
    let xs = vec![Array::from_slice(&[2.0f32], &[]).unwrap(), Array::from_slice(&[5.0f32], &[]).unwrap()];
    // loss = a²·b; aux output 7·a (returned, never differentiated).
    let f =
        |xs: &[Array]| -> Result<Vec<Array>> { Ok(vec![xs[0].square()?.multiply(&xs[1])?, xs[0].mul_scalar(7.0)?]) };
    let (values, grads) = value_and_grad(f, &xs, &[1, 0]).unwrap();
    assert_eq!(scalar(&values[0]), 20.0);
    assert_eq!(scalar(&values[1]), 14.0);
    assert_eq!((scalar(&grads[0]), scalar(&grads[1])), (4.0, 20.0), "d/db = a², d/da = 2ab");
    // stop_gradient cuts the flow.
    let (_, g) =
        value_and_grad(|xs: &[Array]| Ok::<_, Error>(vec![xs[0].stop_gradient()?.square()?]), &xs, &[0]).unwrap();
    assert_eq!(scalar(&g[0]), 0.0);
}

#[test]
fn vjp_of_a_vector_function() {
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let ct = Array::from_slice(&[1.0f32, 10.0, 100.0], &[3]).unwrap();
    let (out, vjps) = vjp(|xs: &[Array]| Ok::<_, Error>(vec![xs[0].square()?]), &[x], &[ct]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![1.0, 4.0, 9.0]);
    assert_eq!(vjps[0].to_vec::<f32>().unwrap(), vec![2.0, 40.0, 600.0]);
}

#[derive(Debug)]
enum MyError {
    #[allow(dead_code)] // carried, only matched on its other variant
    Mlx(Error),
    Data(&'static str),
}

impl From<Error> for MyError {
    fn from(e: Error) -> Self {
        MyError::Mlx(e)
    }
}

#[test]
fn closure_errors_and_panics_come_back_as_errors() {
    let x = vec![Array::from_slice(&[3.0f32], &[]).unwrap()];
    // A typed error from the closure is returned as is.
    let r = value_and_grad(|_: &[Array]| Err::<Vec<Array>, _>(MyError::Data("bad batch")), &x, &[0]);
    assert!(matches!(r, Err(MyError::Data("bad batch"))), "{r:?}");
    // An MLX error inside the closure (a shape mismatch) comes back as that error.
    let r = value_and_grad(|xs: &[Array]| -> Result<Vec<Array>> { Ok(vec![xs[0].reshape(&[2, 2])?]) }, &x, &[0]);
    assert!(matches!(&r, Err(Error::Mlx { op: "reshape", .. })), "{:?}", r.err());
    // A panic is caught at the bridge.
    let r = value_and_grad(|_: &[Array]| -> Result<Vec<Array>> { panic!("boom") }, &x, &[0]);
    assert!(matches!(&r, Err(Error::Closure { message, .. }) if message.contains("boom")), "{:?}", r.err());
    // A non-scalar loss, no outputs, bad argnums: errors, not aborts.
    let r = value_and_grad(|xs: &[Array]| Ok::<_, Error>(vec![xs[0].reshape(&[1])?.broadcast_to(&[2])?]), &x, &[0]);
    assert!(r.is_err());
    let r = value_and_grad(|_: &[Array]| Ok::<_, Error>(vec![]), &x, &[0]);
    assert!(matches!(&r, Err(Error::Host { detail, .. }) if detail.contains("no outputs")), "{:?}", r.err());
    assert!(value_and_grad(|xs: &[Array]| Ok::<_, Error>(vec![xs[0].clone()]), &x, &[1]).is_err());
    assert!(value_and_grad(|xs: &[Array]| Ok::<_, Error>(vec![xs[0].clone()]), &x, &[]).is_err());
    assert!(value_and_grad(|xs: &[Array]| Ok::<_, Error>(vec![xs[0].clone()]), &x, &[0, 0]).is_err());
    // Tracing state recovers: a normal call afterwards works.
    let (_, g) = value_and_grad(|xs: &[Array]| Ok::<_, Error>(vec![xs[0].square()?]), &x, &[0]).unwrap();
    assert_eq!(scalar(&g[0]), 6.0);
}
