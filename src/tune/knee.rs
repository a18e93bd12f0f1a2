//! Kneedle (Satopää et al., 2011) on throughput against device memory: the
//! point where extra memory (layers) stops paying as much.

/// Index of the knee of an increasing curve given as (x, y) points sorted by
/// x, or `None` when the curve is not concave (every step helps at least as
/// much as the last: no knee) or has fewer than three points.
#[must_use]
pub fn kneedle(points: &[(f64, f64)]) -> Option<usize> {
    if points.len() < 3 {
        return None;
    }
    let (x0, x1) = (points[0].0, points[points.len() - 1].0);
    let ymin = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let ymax = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    if x1 <= x0 || ymax <= ymin {
        return None;
    }
    // Normalized difference curve: how far each point lies above the chord.
    let diff: Vec<f64> = points.iter().map(|(x, y)| (y - ymin) / (ymax - ymin) - (x - x0) / (x1 - x0)).collect();
    let (idx, best) = diff
        .iter()
        .enumerate()
        .take(points.len() - 1)
        .skip(1)
        .fold((0, f64::NEG_INFINITY), |acc, (i, d)| if *d > acc.1 { (i, *d) } else { acc });
    // A knee must stand clearly above the chord.
    (best > 0.05).then_some(idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concave_curve_has_its_knee() {
        // Throughput saturates after the third point.
        let p = [(0.0, 10.0), (1.0, 40.0), (2.0, 60.0), (3.0, 64.0), (4.0, 66.0), (5.0, 67.0)];
        assert_eq!(kneedle(&p), Some(2));
    }

    #[test]
    fn convex_curve_has_none() {
        // llama-bench README, 7B Q4_0: tg 13.45/21.36/40.04/71.76/131.66 at ngl 10/20/30/34/35.
        let p = [(10.0, 13.45), (20.0, 21.36), (30.0, 40.04), (34.0, 71.76), (35.0, 131.66)];
        assert_eq!(kneedle(&p), None);
        assert_eq!(kneedle(&p[..2]), None);
    }

    #[test]
    fn flat_or_straight_has_none() {
        assert_eq!(kneedle(&[(0.0, 1.0), (1.0, 1.0), (2.0, 1.0)]), None);
        assert_eq!(kneedle(&[(0.0, 0.0), (1.0, 1.0), (2.0, 2.0)]), None);
    }
}
