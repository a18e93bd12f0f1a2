//! Least-squares fits of the physics DESIGN.md describes: time per token and
//! device memory are close to linear in ngl across partial offload; ngl 0
//! and full offload are their own points.

use serde::{Deserialize, Serialize};

/// Below this R² the line is not trusted between measured points; linear
/// interpolation between neighbours is used instead.
pub const MIN_R2: f64 = 0.9;

/// y = intercept + slope * x, with its quality.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinearFit {
    pub slope: f64,
    pub intercept: f64,
    /// Coefficient of determination; 1 for a perfect fit (and for 2 points).
    pub r2: f64,
    /// (x, y - fitted) for each point used.
    pub residuals: Vec<(f64, f64)>,
    pub n: usize,
    /// Range of x the fit is based on.
    pub x_min: f64,
    pub x_max: f64,
}

impl LinearFit {
    #[must_use]
    pub fn at(&self, x: f64) -> f64 {
        self.intercept + self.slope * x
    }

    /// Largest |residual| relative to the fitted value.
    #[must_use]
    pub fn max_rel_residual(&self) -> f64 {
        self.residuals
            .iter()
            .map(|(x, r)| {
                let f = self.at(*x).abs();
                if f > 0.0 {
                    r.abs() / f
                } else {
                    0.0
                }
            })
            .fold(0.0, f64::max)
    }
}

/// Ordinary least squares. `None` with fewer than two distinct x.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn linear(points: &[(f64, f64)]) -> Option<LinearFit> {
    let n = points.len();
    if n < 2 {
        return None;
    }
    let nf = n as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = points.iter().map(|p| p.1).sum::<f64>() / nf;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    let residuals: Vec<(f64, f64)> = points.iter().map(|p| (p.0, p.1 - (intercept + slope * p.0))).collect();
    let ss_res: f64 = residuals.iter().map(|r| r.1 * r.1).sum();
    let ss_tot: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    let r2 = if ss_tot <= 0.0 { 1.0 } else { 1.0 - ss_res / ss_tot };
    let x_min = points.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x_max = points.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    Some(LinearFit { slope, intercept, r2, residuals, n, x_min, x_max })
}

/// A quantity measured at some ngl values, predicted at any ngl in
/// [0, full]: measured points are used as measured; between them, the
/// linear fit of the partial-offload points (1..full-1), else linear
/// interpolation between the nearest measured neighbors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    /// (ngl, value), ascending, one per ngl.
    pub measured: Vec<(u32, f64)>,
    /// Fit over partial offload (0 < ngl < full), when it has two points.
    pub fit: Option<LinearFit>,
    pub full: u32,
}

impl Curve {
    #[must_use]
    pub fn new(mut measured: Vec<(u32, f64)>, full: u32) -> Curve {
        measured.sort_by_key(|p| p.0);
        measured.dedup_by_key(|p| p.0);
        let partial: Vec<(f64, f64)> =
            measured.iter().filter(|(n, _)| *n > 0 && *n < full).map(|(n, v)| (f64::from(*n), *v)).collect();
        let fit = linear(&partial);
        Curve { measured, fit, full }
    }

    #[must_use]
    pub fn measured_at(&self, ngl: u32) -> Option<f64> {
        self.measured.iter().find(|p| p.0 == ngl).map(|p| p.1)
    }

    /// The predicted value at `ngl`; `None` outside what the data can say
    /// (beyond the last measured point).
    #[must_use]
    pub fn predict(&self, ngl: u32) -> Option<f64> {
        if let Some(v) = self.measured_at(ngl) {
            return Some(v);
        }
        let below = self.measured.iter().rev().find(|p| p.0 < ngl).copied();
        let above = self.measured.iter().find(|p| p.0 > ngl).copied();
        if let Some(fit) = self.fit.as_ref().filter(|f| f.n == 2 || f.r2 >= MIN_R2) {
            let x = f64::from(ngl);
            if ngl > 0 && ngl < self.full && x >= fit.x_min && x <= fit.x_max {
                let v = fit.at(x);
                // Never predict past what the neighbouring measurements say.
                return Some(match (below, above) {
                    (Some((_, y0)), Some((_, y1))) => v.clamp(y0.min(y1), y0.max(y1)),
                    _ => v,
                });
            }
        }
        match (below, above) {
            (Some((x0, y0)), Some((x1, y1))) => {
                let t = f64::from(ngl - x0) / f64::from(x1 - x0);
                Some(y0 + t * (y1 - y0))
            }
            _ => None,
        }
    }

    /// Like [`Curve::predict`], but extends the partial-offload fit past the
    /// last measured point (memory grows with every layer; used to decide
    /// which untried settings would break the cap).
    #[must_use]
    pub fn extrapolate(&self, ngl: u32) -> Option<f64> {
        self.predict(ngl).or_else(|| {
            let fit = self.fit.as_ref()?;
            (ngl > 0).then(|| fit.at(f64::from(ngl)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_line() {
        let f = linear(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]).unwrap();
        assert!((f.slope - 2.0).abs() < 1e-12 && (f.intercept - 1.0).abs() < 1e-12);
        assert!((f.r2 - 1.0).abs() < 1e-12);
        assert!(f.residuals.iter().all(|r| r.1.abs() < 1e-12));
        assert!(linear(&[(1.0, 1.0)]).is_none());
        assert!(linear(&[(1.0, 1.0), (1.0, 2.0)]).is_none());
    }

    #[test]
    fn noisy_line_has_r2_below_one() {
        let f = linear(&[(0.0, 0.0), (1.0, 1.2), (2.0, 1.8), (3.0, 3.1)]).unwrap();
        assert!(f.r2 > 0.95 && f.r2 < 1.0, "{}", f.r2);
        assert_eq!(f.residuals.len(), 4);
    }

    #[test]
    fn curve_uses_measured_then_fit_then_interpolation() {
        // Memory: 100 at ngl 0 (own point), 10 + 5/layer over partial offload, 300 at full (own point).
        let c = Curve::new(vec![(0, 100.0), (10, 60.0), (20, 110.0), (30, 160.0), (35, 300.0)], 35);
        assert_eq!(c.predict(0), Some(100.0));
        assert_eq!(c.predict(35), Some(300.0));
        assert!((c.predict(25).unwrap() - 135.0).abs() < 1e-9, "fit inside the partial range");
        assert!((c.predict(5).unwrap() - 80.0).abs() < 1e-9, "interpolated between 0 and 10");
        assert!((c.predict(32).unwrap() - (160.0 + 2.0 / 5.0 * 140.0)).abs() < 1e-9);
        let short = Curve::new(vec![(0, 1.0), (10, 2.0)], 35);
        assert_eq!(short.predict(20), None);
        let ext = Curve::new(vec![(0, 0.0), (10, 50.0), (20, 100.0)], 35);
        assert!((ext.extrapolate(30).unwrap() - 150.0).abs() < 1e-9);
    }
}
