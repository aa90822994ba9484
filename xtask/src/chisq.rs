//! Chi-square tests for the distribution-equality gate: goodness of fit against an exact
//! distribution and homogeneity of two samples, with p-values from the regularized upper
//! incomplete gamma function Q(df/2, χ²/2).

/// ln Γ(x) (Lanczos, g = 7, n = 9), accurate to ~1e-15 for x > 0.
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let mut a = C[0];
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularized upper incomplete gamma Q(a, x).
fn gamma_q(a: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let gln = ln_gamma(a);
    if x < a + 1.0 {
        // Series for P(a, x).
        let (mut sum, mut term, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..10_000 {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * 1e-15 {
                break;
            }
        }
        1.0 - sum * (-x + a * x.ln() - gln).exp()
    } else {
        // Continued fraction (modified Lentz) for Q(a, x).
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let del = d * c;
            h *= del;
            if (del - 1.0).abs() < 1e-15 {
                break;
            }
        }
        (-x + a * x.ln() - gln).exp() * h
    }
}

/// P(χ²_df ≥ stat).
pub fn p_value(stat: f64, df: usize) -> f64 {
    gamma_q(df as f64 / 2.0, stat / 2.0)
}

/// A test result.
#[derive(Clone, Copy, Debug)]
pub struct Test {
    pub stat: f64,
    pub df: usize,
    pub p: f64,
}

/// Cells whose expected count under `probs` is at least 5, plus one pooled "rest" cell.
pub fn bins(probs: &[f64], n: usize) -> Vec<Vec<usize>> {
    let mut kept: Vec<Vec<usize>> = Vec::new();
    let mut rest = Vec::new();
    for (i, &p) in probs.iter().enumerate() {
        if p * n as f64 >= 5.0 {
            kept.push(vec![i]);
        } else {
            rest.push(i);
        }
    }
    let rest_mass: f64 = rest.iter().map(|&i| probs[i]).sum();
    if !rest.is_empty() {
        if rest_mass * n as f64 >= 5.0 || kept.is_empty() {
            kept.push(rest);
        } else if let Some(last) = kept.last_mut() {
            last.extend(rest);
        }
    }
    kept
}

fn binned(counts: &[usize], bins: &[Vec<usize>]) -> Vec<f64> {
    bins.iter().map(|b| b.iter().map(|&i| counts[i] as f64).sum()).collect()
}

/// Goodness of fit of `counts` against `probs`.
pub fn goodness_of_fit(counts: &[usize], probs: &[f64], bins: &[Vec<usize>]) -> Test {
    let n: f64 = counts.iter().sum::<usize>() as f64;
    let obs = binned(counts, bins);
    let exp: Vec<f64> = bins.iter().map(|b| n * b.iter().map(|&i| probs[i]).sum::<f64>()).collect();
    let stat = obs.iter().zip(&exp).map(|(o, e)| (o - e).powi(2) / e).sum();
    let df = bins.len().saturating_sub(1).max(1);
    Test { stat, df, p: p_value(stat, df) }
}

/// Homogeneity of two samples over the same bins (2 × K contingency table).
pub fn homogeneity(a: &[usize], b: &[usize], bins: &[Vec<usize>]) -> Test {
    let (oa, ob) = (binned(a, bins), binned(b, bins));
    let (na, nb): (f64, f64) = (oa.iter().sum(), ob.iter().sum());
    let mut stat = 0.0;
    for (x, y) in oa.iter().zip(&ob) {
        let col = x + y;
        if col == 0.0 {
            continue;
        }
        let (ea, eb) = (col * na / (na + nb), col * nb / (na + nb));
        stat += (x - ea).powi(2) / ea + (y - eb).powi(2) / eb;
    }
    let df = bins.len().saturating_sub(1).max(1);
    Test { stat, df, p: p_value(stat, df) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p_values_match_tables() {
        // Critical values of χ² at α = 0.05 and 0.001.
        assert!((p_value(3.841, 1) - 0.05).abs() < 1e-3);
        assert!((p_value(18.307, 10) - 0.05).abs() < 1e-3);
        assert!((p_value(29.588, 10) - 0.001).abs() < 1e-4);
        assert!((p_value(124.342, 100) - 0.05).abs() < 1e-3);
        assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn detects_a_biased_sample() {
        let probs = [0.25; 4];
        let b = bins(&probs, 4000);
        let fair = goodness_of_fit(&[1000, 990, 1010, 1000], &probs, &b);
        assert!(fair.p > 0.5, "{fair:?}");
        let biased = goodness_of_fit(&[1200, 900, 950, 950], &probs, &b);
        assert!(biased.p < 1e-6, "{biased:?}");
        assert!(homogeneity(&[1000, 990, 1010, 1000], &[1200, 900, 950, 950], &b).p < 1e-4);
    }
}
