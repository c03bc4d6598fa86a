//! Standard output, written in one place.
//!
//! Every command writes its results through [`outln!`] and [`out!`] (or [`write_str`]), never `println!`,
//! which panics when the write fails. Messages go to standard error through [`errln!`] and [`err!`],
//! which drop a failed write (a closed stderr, `2>&1 | head`) instead of panicking as `eprintln!` does:
//! there is nowhere left to report it. A closed pipe (`int4 generate … | head`) is not an error: the
//! command stops at once — a generation ends at the next token — and exits 0 without a message, as
//! ripgrep does. Any other write error (`> /dev/full`) is one line on stderr and exit status 1.

use std::fmt;
use std::io::Write;

/// A failed write to standard output.
#[derive(Debug)]
pub(crate) enum OutError {
    /// The reader went away (EPIPE): stop quietly.
    Closed,
    /// Anything else.
    Failed(std::io::Error),
}

impl fmt::Display for OutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutError::Closed => f.write_str("standard output was closed"),
            OutError::Failed(e) => write!(f, "cannot write to standard output: {e}"),
        }
    }
}

impl std::error::Error for OutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OutError::Closed => None,
            OutError::Failed(e) => Some(e),
        }
    }
}

impl From<std::io::Error> for OutError {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe { OutError::Closed } else { OutError::Failed(e) }
    }
}

/// Writes `args` to standard output and flushes it, so that a failure is seen here, not at exit.
pub(crate) fn write_fmt(args: fmt::Arguments<'_>) -> Result<(), OutError> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)?;
    out.flush()?;
    Ok(())
}

/// Writes `s` to standard output and flushes it.
pub(crate) fn write_str(s: &str) -> Result<(), OutError> {
    write_fmt(format_args!("{s}"))
}

/// `println!` that returns a [`Result<(), OutError>`](OutError).
macro_rules! outln {
    () => {
        $crate::out::write_fmt(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write_fmt(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that returns a [`Result<(), OutError>`](OutError).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write_fmt(format_args!($($arg)*))
    };
}

/// `eprintln!` that ignores a failed write.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that ignores a failed write.
macro_rules! err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

pub(crate) use {err, errln, out, outln};

/// Whether `e` is a closed standard output (the command should exit 0 silently).
pub(crate) fn is_closed(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(e.downcast_ref::<OutError>(), Some(OutError::Closed))
}
