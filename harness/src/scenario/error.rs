//! Scenario errors that point at the place to fix: `FILE:LINE:COL: KEY: message` for the file,
//! `--set KEY: message` for a command-line override.

use std::fmt;
use std::path::PathBuf;

/// Where a problem was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// In the scenario file; line and column are 1-based.
    File {
        path: PathBuf,
        line: usize,
        col: usize,
    },
    /// In a `--set KEY=VALUE` override.
    Override,
    /// In a scenario built in memory (no file); only the key is known.
    Memory,
}

/// One problem with one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub origin: Origin,
    /// Dotted key path, e.g. `traffic.prompt_tokens.max`.
    pub key: String,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = if self.key.is_empty() {
            "(top level)"
        } else {
            &self.key
        };
        match &self.origin {
            Origin::File { path, line, col } => {
                write!(
                    f,
                    "{}:{line}:{col}: {key}: {}",
                    path.display(),
                    self.message
                )
            }
            Origin::Override => write!(f, "--set {key}: {}", self.message),
            Origin::Memory => write!(f, "{key}: {}", self.message),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// One or more problems, each on its own line.
    #[error("{}", join_lines(.0))]
    Invalid(Vec<Diagnostic>),
}

impl ScenarioError {
    /// The problems found (empty for I/O errors).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            ScenarioError::Io { .. } => &[],
            ScenarioError::Invalid(d) => d,
        }
    }
}

fn join_lines(diagnostics: &[Diagnostic]) -> String {
    diagnostics
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A problem found by a check that knows only the key; `load` gives it a place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyProblem {
    pub key: String,
    pub message: String,
}

impl KeyProblem {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> KeyProblem {
        KeyProblem {
            key: key.into(),
            message: message.into(),
        }
    }
}
