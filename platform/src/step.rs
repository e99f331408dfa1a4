//! The kernels' error type: which step failed, and the driver's error.

use bareverbs::error::Error;
use bareverbs::verbs::Gid;

/// Which step failed, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The step.
    pub step: &'static str,
    /// The error.
    pub error: Error,
}

impl core::fmt::Display for Failure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}: {}", self.step, self.error)
    }
}

/// A driver result named by its step.
pub trait Step<T> {
    /// The result, its error as a [`Failure`] at `step`.
    fn at(self, step: &'static str) -> Result<T, Failure>;
}

impl<T> Step<T> for Result<T, Error> {
    fn at(self, step: &'static str) -> Result<T, Failure> {
        self.map_err(|error| Failure { step, error })
    }
}

impl<T, O> Step<T> for Result<T, (O, Error)> {
    fn at(self, step: &'static str) -> Result<T, Failure> {
        self.map_err(|(_, error)| Failure { step, error })
    }
}

/// A GID as Linux prints it: eight groups of four hex digits.
pub struct DisplayGid(pub Gid);

impl core::fmt::Display for DisplayGid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (i, pair) in self.0.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}
