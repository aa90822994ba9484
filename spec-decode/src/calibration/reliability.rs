//! How well a confidence predicts acceptance: expected calibration error, AUROC and Brier score
//! of probabilities `p` against 0/1 outcomes `y` (used by calibration reports).

/// Expected calibration error over `bins` equal-width bins of [0, 1]: Σ_b (n_b / N) · |mean p −
/// mean y| within the bin. p = 1 falls in the last bin. 0 for no samples.
pub fn ece(p: &[f32], y: &[bool], bins: usize) -> f64 {
    let bins = bins.max(1);
    let (mut n, mut sp, mut sy) = (vec![0usize; bins], vec![0f64; bins], vec![0f64; bins]);
    let mut total = 0usize;
    for (&pi, &yi) in p.iter().zip(y) {
        if !pi.is_finite() {
            continue;
        }
        let b = ((pi.clamp(0.0, 1.0) as f64 * bins as f64) as usize).min(bins - 1);
        n[b] += 1;
        sp[b] += pi as f64;
        sy[b] += yi as u8 as f64;
        total += 1;
    }
    if total == 0 {
        return 0.0;
    }
    (0..bins).filter(|&b| n[b] > 0).map(|b| (sp[b] - sy[b]).abs() / total as f64).sum()
}

/// The reliability diagram's points: for each non-empty bin of `bins` equal-width bins of
/// [0, 1], (mean prediction, observed frequency, count).
pub fn reliability_bins(p: &[f32], y: &[bool], bins: usize) -> Vec<(f64, f64, usize)> {
    let bins = bins.max(1);
    let (mut n, mut sp, mut sy) = (vec![0usize; bins], vec![0f64; bins], vec![0f64; bins]);
    for (&pi, &yi) in p.iter().zip(y).filter(|(p, _)| p.is_finite()) {
        let b = ((pi.clamp(0.0, 1.0) as f64 * bins as f64) as usize).min(bins - 1);
        n[b] += 1;
        sp[b] += pi as f64;
        sy[b] += yi as u8 as f64;
    }
    (0..bins).filter(|&b| n[b] > 0).map(|b| (sp[b] / n[b] as f64, sy[b] / n[b] as f64, n[b])).collect()
}

/// Area under the ROC curve (the probability that a random positive scores above a random
/// negative, ties counting one half); None without both outcomes.
pub fn auroc(p: &[f32], y: &[bool]) -> Option<f64> {
    let mut v: Vec<(f32, bool)> = p.iter().copied().zip(y.iter().copied()).filter(|(s, _)| s.is_finite()).collect();
    let pos = v.iter().filter(|x| x.1).count();
    let neg = v.len() - pos;
    if pos == 0 || neg == 0 {
        return None;
    }
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Mann–Whitney U with average ranks over ties.
    let mut rank_sum = 0f64;
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j < v.len() && v[j].0 == v[i].0 {
            j += 1;
        }
        let avg_rank = (i + 1 + j) as f64 / 2.0; // ranks i+1..=j
        rank_sum += avg_rank * v[i..j].iter().filter(|x| x.1).count() as f64;
        i = j;
    }
    Some((rank_sum - (pos * (pos + 1)) as f64 / 2.0) / (pos as f64 * neg as f64))
}

/// Mean negative log-likelihood of the outcomes (probabilities clamped to [1e-7, 1 − 1e-7]);
/// 0 for no samples.
pub fn log_loss(p: &[f32], y: &[bool]) -> f64 {
    mean_score(p, y, |s, t| {
        let s = s.clamp(1e-7, 1.0 - 1e-7);
        -(if t { s.ln() } else { (1.0 - s).ln() })
    })
}

/// Mean squared error of the probabilities; 0 for no samples.
pub fn brier(p: &[f32], y: &[bool]) -> f64 {
    mean_score(p, y, |s, t| (s - t as u8 as f64).powi(2))
}

/// Mean of `score(probability, outcome)` over the samples with a finite probability; 0 for none.
fn mean_score(p: &[f32], y: &[bool], score: impl Fn(f64, bool) -> f64) -> f64 {
    let (sum, n) = p
        .iter()
        .zip(y)
        .filter(|(s, _)| s.is_finite())
        .fold((0.0, 0usize), |(sum, n), (&s, &t)| (sum + score(s as f64, t), n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A scripted trace, with every value worked out by hand.
    const P: [f32; 6] = [0.1, 0.4, 0.35, 0.8, 0.8, 1.0];
    const Y: [bool; 6] = [false, false, true, true, false, true];

    #[test]
    fn ece_by_hand() {
        // 2 bins: [0, .5) holds .1 .4 .35 (mean .2833, y 1/3); [.5, 1] holds .8 .8 1 (mean .8667, y 2/3).
        let want = 3.0 / 6.0 * (0.85f64 / 3.0 - 1.0 / 3.0).abs() + 3.0 / 6.0 * (2.6f64 / 3.0 - 2.0 / 3.0).abs();
        assert!((ece(&P, &Y, 2) - want).abs() < 1e-6, "{} vs {want}", ece(&P, &Y, 2));
        assert_eq!(ece(&[], &[], 20), 0.0);
        assert!((ece(&[1.0, 0.0], &[true, false], 20)).abs() < 1e-12, "perfect predictions: 0");
    }

    #[test]
    fn reliability_bins_by_hand() {
        let b = reliability_bins(&P, &Y, 2);
        assert_eq!(b.len(), 2);
        assert!((b[0].0 - 0.85 / 3.0).abs() < 1e-6 && (b[0].1 - 1.0 / 3.0).abs() < 1e-12 && b[0].2 == 3);
        assert!((b[1].0 - 2.6 / 3.0).abs() < 1e-6 && (b[1].1 - 2.0 / 3.0).abs() < 1e-12 && b[1].2 == 3);
        assert_eq!(reliability_bins(&[0.05], &[true], 20), vec![(0.05f32 as f64, 1.0, 1)]);
    }

    #[test]
    fn auroc_by_hand() {
        // Positives .35 .8 1.0 vs negatives .1 .4 .8: pairs won 1+... = (.35>.1) + (.8>.1,.4; tie .8 = ½)
        // + (1 > all three) = 1 + 2.5 + 3 = 6.5 of 9.
        assert!((auroc(&P, &Y).unwrap() - 6.5 / 9.0).abs() < 1e-12);
        assert_eq!(auroc(&[0.3, 0.4], &[true, true]), None);
        assert_eq!(auroc(&[0.1, 0.9], &[false, true]), Some(1.0));
    }

    #[test]
    fn brier_by_hand() {
        let want = (0.01 + 0.16 + 0.4225 + 0.04 + 0.64 + 0.0) / 6.0;
        assert!((brier(&P, &Y) - want).abs() < 1e-6);
    }
}
