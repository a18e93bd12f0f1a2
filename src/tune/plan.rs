//! Which ngl values to measure.

/// The default grid: 0, 10, 20, ... below full offload, then full offload
/// (n_layer + 1: this llama.cpp counts the output layer, which goes first).
#[must_use]
pub fn default_grid(n_layer_full: u32, step: u32) -> Vec<u32> {
    let step = step.max(1);
    let mut g: Vec<u32> = (0..n_layer_full).step_by(step as usize).collect();
    g.push(n_layer_full);
    g
}

/// Normalizes a user grid: 99 (or anything above full) means full offload;
/// sorted ascending, duplicates dropped.
#[must_use]
pub fn normalize(values: &[u32], n_layer_full: u32) -> Vec<u32> {
    let mut g: Vec<u32> = values.iter().map(|v| (*v).min(n_layer_full)).collect();
    g.sort_unstable();
    g.dedup();
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_has_zero_and_full_offload() {
        assert_eq!(default_grid(19, 10), vec![0, 10, 19]);
        assert_eq!(default_grid(33, 10), vec![0, 10, 20, 30, 33]);
        assert_eq!(default_grid(30, 10), vec![0, 10, 20, 30]);
        assert_eq!(default_grid(5, 10), vec![0, 5]);
        assert_eq!(default_grid(41, 10), vec![0, 10, 20, 30, 40, 41]);
    }

    #[test]
    fn user_values_are_clamped_and_deduplicated() {
        assert_eq!(normalize(&[99, 0, 10, 10, 19, 25], 19), vec![0, 10, 19]);
        assert_eq!(normalize(&[5, 3], 19), vec![3, 5]);
    }
}
