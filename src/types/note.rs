//! What the tuner says beside its numbers: one enum of notes and warnings,
//! each carrying its values and the context size it belongs to. The words
//! live with the report (`report::note`); a warning is a kind, not a prefix.

use serde::{Deserialize, Serialize};

use super::BusyProcess;

/// One note, and the context it was found at when a tune covered several.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Note {
    /// The context size this note belongs to; `None`: the whole tune (or its largest context).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctx: Option<u32>,
    #[serde(flatten)]
    pub kind: NoteKind,
}

/// What a note says, with its values. Serialized with a `kind` tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NoteKind {
    /// Repetitions of a test varied by more than 10% (warning).
    Noisy { test: String, n_gpu_layers: u32, n_threads: u32, cv: f64, avg_ts: f64, stddev_ts: f64 },
    /// Trials ran while other processes took the machine (warning).
    Busy {
        trials: usize,
        of: usize,
        worst_cores: f64,
        cores: u32,
        top: Vec<BusyProcess>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu_busy_pct: Option<u32>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gpu_pids: Vec<u32>,
    },
    /// A trial asked for more threads than there were free cores (warning).
    Threads {
        n_threads: u32,
        n_gpu_layers: u32,
        free_cores: f64,
        cores: u32,
        others_cores: f64,
        /// The CPU quota that limited it (not other processes), in cores.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quota: Option<f64>,
    },
    /// A source of facts about the machine is missing or untrustworthy.
    Hardware { text: String },
    /// Op offload was turned off (every offload device runs on the CPU).
    OpOffload { text: String },
    /// Finished trials resumed from a checkpoint, or none to resume.
    Resume { text: String },
    /// llama.cpp's dry run could not price the settings.
    Prediction { text: String },
    /// What the search says about itself (stopped early, confirmation moved).
    Search { text: String },
    /// An escape hatch measured or priced at a context.
    Hatch { text: String },
    /// The split across several devices.
    Split { text: String },
    /// Nothing measured stays under the cap.
    OverCap { text: String },
    /// What the consumer's server runs at a context (Ollama's batch).
    Consumer { text: String },
    /// A note from a profile written before notes had kinds.
    Text { text: String },
}

impl Note {
    #[must_use]
    pub fn new(kind: NoteKind) -> Self {
        Note { ctx: None, kind }
    }

    /// The same note, said of context `ctx` (kept if it already names one).
    #[must_use]
    pub fn at(mut self, ctx: u32) -> Self {
        self.ctx = self.ctx.or(Some(ctx));
        self
    }

    /// A warning is printed beside the numbers; other notes before the report.
    #[must_use]
    pub fn is_warning(&self) -> bool {
        matches!(self.kind, NoteKind::Noisy { .. } | NoteKind::Busy { .. } | NoteKind::Threads { .. })
    }

    /// The words of a text note (`None` for the kinds whose words the report composes).
    #[must_use]
    pub fn text(&self) -> Option<&str> {
        self.kind.text()
    }
}

impl NoteKind {
    /// The words of a text kind (`None` for the kinds whose words the report composes).
    #[must_use]
    pub fn text(&self) -> Option<&str> {
        match self {
            NoteKind::Hardware { text }
            | NoteKind::OpOffload { text }
            | NoteKind::Resume { text }
            | NoteKind::Prediction { text }
            | NoteKind::Search { text }
            | NoteKind::Hatch { text }
            | NoteKind::Split { text }
            | NoteKind::OverCap { text }
            | NoteKind::Consumer { text }
            | NoteKind::Text { text } => Some(text),
            NoteKind::Noisy { .. } | NoteKind::Busy { .. } | NoteKind::Threads { .. } => None,
        }
    }
}

macro_rules! text_notes {
    ($($f:ident => $k:ident),*) => {
        impl Note {
            $(
                #[must_use]
                pub fn $f(text: impl Into<String>) -> Self {
                    Note::new(NoteKind::$k { text: text.into() })
                }
            )*
        }
    };
}
text_notes!(hardware => Hardware, op_offload => OpOffload, resume => Resume, prediction => Prediction,
    search => Search, hatch => Hatch, split => Split, over_cap => OverCap, consumer => Consumer);

/// Profiles of schema 2 kept notes as plain strings; they read back as text notes.
impl<'de> Deserialize<'de> for Note {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Typed {
            #[serde(default)]
            ctx: Option<u32>,
            #[serde(flatten)]
            kind: NoteKind,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Words(String),
            Typed(Typed),
        }
        Ok(match Repr::deserialize(d)? {
            Repr::Words(text) => Note::new(NoteKind::Text { text }),
            Repr::Typed(t) => Note { ctx: t.ctx, kind: t.kind },
        })
    }
}
