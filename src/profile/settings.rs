//! What a tune's settings say beyond their fields: the consumer, the
//! depth of each context, the streams decoded together.

use super::{Consumer, Settings};

impl Settings {
    /// The consumer's settings where Ollama is the consumer (its server's
    /// environment, found or its defaults).
    #[must_use]
    pub fn ollama(&self) -> Option<&Consumer> {
        self.consumer.as_ref().filter(|c| c.program == crate::consumer::Program::Ollama)
    }

    /// Sequences each tg test decodes together: `--parallel` under
    /// `--objective throughput`, else one.
    #[must_use]
    pub fn streams(&self) -> u32 {
        match (self.objective, self.parallel_streams) {
            (crate::types::Objective::Throughput, Some(n)) => n.max(1),
            _ => 1,
        }
    }

    /// Makes each context `n` slots of itself, decoded together
    /// (`--objective throughput --parallel N`): the KV cache sized for `n`
    /// sequences, `-np n`; a consumer's own slots are replaced.
    pub fn decode_together(&mut self, n: u32) {
        self.into_slots(n);
        self.parallel_streams = Some(n);
    }

    /// Makes each context `n` slots of one slot's context (`-c ctx x n
    /// -np n`, as llama-server splits it and Ollama starts it); slots set
    /// before are replaced.
    pub fn into_slots(&mut self, n: u32) {
        crate::consumer::into_slots((&mut self.n_ctx, &mut self.contexts, &mut self.n_parallel), n);
    }

    /// The depth a context is measured at: `--depth`, else half the
    /// context (where tg equals its mean over a filled window), always
    /// leaving room for the longer test.
    #[must_use]
    pub fn depth_at(&self, n_ctx: u32) -> u32 {
        let slot = n_ctx / self.n_parallel.max(1);
        let room = slot.saturating_sub(self.n_prompt.max(self.n_gen));
        self.n_depth.unwrap_or(slot / 2).min(room)
    }

    /// The depth rule in words, for the report.
    #[must_use]
    pub fn depth_rule(&self) -> String {
        let at: Vec<String> = self.contexts().iter().map(|c| format!("{} at {c}", self.depth_at(*c))).collect();
        match self.n_depth {
            None => format!(
                "depth: half of each context ({}): each test runs with that many tokens already in the KV cache, where tg equals its mean over a filled window; --depth sets it",
                at.join(", ")
            ),
            Some(0) => "depth: 0 (an empty KV cache before each test)".to_string(),
            Some(_) => format!("depth: --depth ({}) tokens in the KV cache before each test", at.join(", ")),
        }
    }

    /// The context sizes tuned, ascending.
    #[must_use]
    pub fn contexts(&self) -> Vec<u32> {
        if self.contexts.is_empty() {
            vec![self.n_ctx]
        } else {
            self.contexts.clone()
        }
    }
}
