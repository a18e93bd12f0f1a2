//! The per-device split of a placement's layers and the order the devices
//! take them in, kept inline so it stays a plain value.

/// Layers per offload device, in llama.cpp's device order (at most 16, as
/// llama.cpp's devices and RPC servers), and the order the devices take
/// layers in (`--device`: the first holds the first offloaded layers, the
/// last one with layers the output layer); kept inline so a candidate
/// stays a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Split {
    n: u8,
    layers: [u16; 16],
    /// Device indices (llama.cpp's order) in the order they take layers;
    /// all zero: llama.cpp's order.
    order: [u8; 16],
    /// Its split mode, as an index into [`MODES`] (0: layer, llama.cpp's default).
    mode: u8,
}

/// The split modes a [`Split`] can be in, llama.cpp's default first.
const MODES: [crate::placement::SplitMode; 4] = [
    crate::placement::SplitMode::Layer,
    crate::placement::SplitMode::None,
    crate::placement::SplitMode::Row,
    crate::placement::SplitMode::Tensor,
];

impl Split {
    /// Layers per device in llama.cpp's order, the devices in that order.
    ///
    /// # Panics
    /// Over 16 devices or 65535 layers on one (llama.cpp allows neither).
    #[must_use]
    pub fn new(layers: &[u32]) -> Split {
        assert!(layers.len() <= 16, "llama.cpp takes at most 16 devices");
        let mut s = Split { n: u8::try_from(layers.len()).unwrap_or(16), layers: [0; 16], order: [0; 16], mode: 0 };
        for (i, l) in layers.iter().enumerate() {
            s.layers[i] = u16::try_from(*l).expect("layers per device fit in u16");
        }
        s
    }

    /// Layers per device in llama.cpp's order, the devices taking layers
    /// in `order` (indices into llama.cpp's order; llama.cpp's own order
    /// is kept as no order).
    ///
    /// # Panics
    /// As [`Split::new`], or when `order` is not a permutation of the devices.
    #[must_use]
    pub fn ordered(layers: &[u32], order: &[usize]) -> Split {
        let mut s = Split::new(layers);
        let mut seen = order.to_vec();
        seen.sort_unstable();
        assert!(seen == (0..layers.len()).collect::<Vec<_>>(), "an order names every device once");
        if order.iter().enumerate().any(|(i, d)| i != *d) {
            for (i, d) in order.iter().enumerate() {
                s.order[i] = u8::try_from(*d).unwrap_or(0);
            }
        }
        s
    }

    /// The same split in another split mode (`-sm row`, `-sm tensor`).
    #[must_use]
    pub fn with_mode(mut self, mode: crate::placement::SplitMode) -> Split {
        self.mode = u8::try_from(MODES.iter().position(|m| *m == mode).unwrap_or(0)).unwrap_or(0);
        self
    }

    /// Its split mode (`-sm`).
    #[must_use]
    pub fn mode(&self) -> crate::placement::SplitMode {
        MODES.get(usize::from(self.mode)).copied().unwrap_or_default()
    }

    /// Layers per device, in llama.cpp's order.
    #[must_use]
    pub fn layers(&self) -> Vec<u32> {
        self.layers[..usize::from(self.n)].iter().map(|l| u32::from(*l)).collect()
    }

    /// Whether the devices take layers in llama.cpp's order.
    #[must_use]
    pub fn in_llama_order(&self) -> bool {
        self.order.iter().all(|d| *d == 0)
    }

    /// The device indices (llama.cpp's order) in the order they take layers.
    #[must_use]
    pub fn order(&self) -> Vec<usize> {
        let n = usize::from(self.n);
        if self.in_llama_order() {
            (0..n).collect()
        } else {
            self.order[..n].iter().map(|d| usize::from(*d)).collect()
        }
    }

    /// Layers per device in the order they take them (llama.cpp's `-ts`
    /// beside `--device`).
    #[must_use]
    pub fn listed(&self) -> Vec<u32> {
        let l = self.layers();
        self.order().into_iter().map(|d| l[d]).collect()
    }

    /// The `--device` list: `names` (llama.cpp's order) in this order;
    /// empty in llama.cpp's order.
    #[must_use]
    pub fn device_names(&self, names: &[String]) -> Vec<String> {
        if self.in_llama_order() {
            return Vec::new();
        }
        self.order().into_iter().map(|d| names.get(d).cloned().unwrap_or_default()).collect()
    }

    /// The device that runs the output layer: the last, in this order,
    /// that holds layers (llama.cpp offloads the output first).
    #[must_use]
    pub fn output_device(&self) -> Option<usize> {
        let l = self.layers();
        self.order().into_iter().rev().find(|d| l[*d] > 0)
    }
}
