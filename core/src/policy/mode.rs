//! The kill switch: what an engine may do beyond a single attempt, flipped
//! at run time ([`crate::Engine::set_mode`]) or from `RETRYWISE_DISABLE`
//! when the engine is built, without a reload.

use crate::policy::PolicyError;
use serde::Serialize;

/// The kill switch: what the engine may do beyond a single attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Mode {
    /// Retries (and fallbacks) allowed.
    pub retries: bool,
    /// Fallback to other upstreams allowed.
    pub fallback: bool,
    /// Hedged attempts allowed.
    pub hedging: bool,
}

impl Default for Mode {
    fn default() -> Self {
        Mode {
            retries: true,
            fallback: true,
            hedging: true,
        }
    }
}

impl Mode {
    /// Parses a `RETRYWISE_DISABLE` value: a comma-separated list of
    /// `retries`, `fallback`, `hedging` or `all` (empty = nothing disabled).
    pub fn from_disable_list(list: &str) -> Result<Mode, PolicyError> {
        let mut m = Mode::default();
        for part in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match part.to_ascii_lowercase().as_str() {
                "retries" | "retry" => m.retries = false,
                "fallback" | "fallbacks" => m.fallback = false,
                "hedging" | "hedges" | "hedge" => m.hedging = false,
                "all" => {
                    m = Mode {
                        retries: false,
                        fallback: false,
                        hedging: false,
                    }
                }
                other => {
                    return Err(PolicyError {
                        path: "RETRYWISE_DISABLE".into(),
                        message: format!("unknown switch {other:?}; expected retries, fallback, hedging or all"),
                    })
                }
            }
        }
        Ok(m)
    }

    pub(crate) fn bits(self) -> u8 {
        self.retries as u8 | (self.fallback as u8) << 1 | (self.hedging as u8) << 2
    }

    pub(crate) fn from_bits(b: u8) -> Mode {
        Mode {
            retries: b & 1 != 0,
            fallback: b & 2 != 0,
            hedging: b & 4 != 0,
        }
    }
}
