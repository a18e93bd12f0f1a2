//! Small statistics with no I/O: the numbers llama-bench reports.

use statrs::statistics::Statistics;

/// Arithmetic mean; 0 for no samples.
#[must_use]
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.mean()
    }
}

/// Sample standard deviation (Bessel's correction, as llama-bench); 0 for
/// fewer than two samples.
#[must_use]
pub fn stddev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        0.0
    } else {
        v.std_dev()
    }
}

/// Welch's unequal-variances t-test: (t, degrees of freedom, two-sided p).
/// `None` with fewer than two samples on either side.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn welch(a: &[f64], b: &[f64]) -> Option<(f64, f64, f64)> {
    use statrs::distribution::{ContinuousCDF, StudentsT};
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let (ma, mb) = (mean(a), mean(b));
    let (va, vb) = (stddev(a).powi(2) / a.len() as f64, stddev(b).powi(2) / b.len() as f64);
    let se2 = va + vb;
    if se2 <= 0.0 {
        // No spread at all: any difference is certain, none is no evidence.
        let p = if (ma - mb).abs() > 0.0 { 0.0 } else { 1.0 };
        return Some((if p == 0.0 { f64::INFINITY } else { 0.0 }, f64::INFINITY, p));
    }
    let t = (ma - mb) / se2.sqrt();
    let df = se2 * se2 / (va * va / (a.len() as f64 - 1.0) + vb * vb / (b.len() as f64 - 1.0));
    let dist = StudentsT::new(0.0, 1.0, df).ok()?;
    let p = 2.0 * (1.0 - dist.cdf(t.abs()));
    Some((t, df, p.clamp(0.0, 1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welch_matches_a_worked_example() {
        // Welch's own example data (Wikipedia, "Welch's t-test"): t = -2.46,
        // df = 24.99, p = 0.021; exact values computed independently.
        let a = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4];
        let b = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4];
        let (t, df, p) = welch(&a, &b).unwrap();
        assert!((t - -2.455_356).abs() < 1e-5, "t {t}");
        assert!((df - 24.988_529).abs() < 1e-5, "df {df}");
        assert!((p - 0.021_378).abs() < 1e-5, "p {p}");
        assert!(welch(&[1.0], &[2.0, 3.0]).is_none());
        assert_eq!(welch(&[2.0, 2.0], &[2.0, 2.0]).unwrap().2, 1.0);
        assert_eq!(welch(&[2.0, 2.0], &[3.0, 3.0]).unwrap().2, 0.0);
    }

    #[test]
    fn mean_and_sample_stddev() {
        let v = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert!((mean(&v) - 5.0).abs() < 1e-12);
        // population sd is 2; the sample sd is sqrt(32/7)
        assert!((stddev(&v) - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!(stddev(&[3.0]), 0.0);
        assert_eq!(mean(&[]), 0.0);
    }
}
