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

#[cfg(test)]
mod tests {
    use super::*;

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
