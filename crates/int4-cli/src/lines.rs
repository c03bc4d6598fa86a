//! Reading the chat's input a line at a time, bounded: a line is at most [`LINE_CAP`] bytes, and input
//! without a line end (`< /dev/zero`) is skipped only up to [`SKIP_CAP`] bytes before the chat gives up,
//! so neither memory nor time runs away on it.

use std::io::BufRead;

/// The longest line a chat turn may be.
pub(crate) const LINE_CAP: usize = 1 << 20;
/// How much of an overlong line is skipped, looking for its end, before the input counts as endless.
pub(crate) const SKIP_CAP: usize = 64 << 20;

/// One line of input.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// A line (without its line end).
    Text(String),
    /// A line that is not UTF-8: the user is told and asked again.
    NotUtf8,
    /// A line longer than [`LINE_CAP`], skipped to its end.
    TooLong,
    /// The end of the input.
    End,
}

/// Why reading stopped for good.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The input failed.
    Io(std::io::Error),
    /// More than [`SKIP_CAP`] bytes without a line end.
    Endless,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "reading the input: {e}"),
            ReadError::Endless => write!(f, "the input has no line end in its next {SKIP_CAP} bytes"),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Io(e) => Some(e),
            ReadError::Endless => None,
        }
    }
}

/// Reads the next line of `input` under the caps of the module docs.
pub(crate) fn read_line(input: &mut impl BufRead) -> Result<Line, ReadError> {
    let mut line = Vec::new();
    let mut skipped = 0usize;
    let mut too_long = false;
    loop {
        let buf = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadError::Io(e)),
        };
        if buf.is_empty() {
            // End of input: a last line without a line end still counts.
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::End,
                (false, false) => text(line),
            });
        }
        let (chunk, found_end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if too_long {
            skipped += chunk;
        } else if line.len() + chunk > LINE_CAP + 1 {
            too_long = true;
            skipped += line.len() + chunk;
            line = Vec::new();
        } else {
            line.extend_from_slice(&buf[..chunk]);
        }
        input.consume(chunk);
        if found_end {
            if too_long {
                return Ok(Line::TooLong);
            }
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(text(line));
        }
        if skipped > SKIP_CAP {
            return Err(ReadError::Endless);
        }
    }
}

fn text(bytes: Vec<u8>) -> Line {
    String::from_utf8(bytes).map_or(Line::NotUtf8, Line::Text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8]) -> Vec<Line> {
        let mut r = std::io::BufReader::with_capacity(7, input);
        let mut out = Vec::new();
        loop {
            match read_line(&mut r).unwrap() {
                Line::End => return out,
                l => out.push(l),
            }
        }
    }

    #[test]
    fn lines_bad_lines_and_the_end() {
        let t = |s: &str| Line::Text(s.into());
        assert_eq!(lines(b"hello\r\nworld\n\nlast"), [t("hello"), t("world"), t(""), t("last")]);
        assert_eq!(lines(b"a \xff\xfe b\nnext\n"), [Line::NotUtf8, t("next")]);
        let mut long = vec![b'x'; LINE_CAP + 1];
        long.extend_from_slice(b"\nafter\n");
        assert_eq!(lines(&long), [Line::TooLong, t("after")]);
        let exact = [vec![b'y'; LINE_CAP], b"\n".to_vec()].concat();
        assert_eq!(lines(&exact), [t(&"y".repeat(LINE_CAP))]);
        assert!(lines(b"").is_empty());
    }

    #[test]
    fn endless_input_is_an_error_after_the_skip_cap() {
        let mut zeros = std::io::BufReader::new(std::io::repeat(0));
        assert!(matches!(read_line(&mut zeros), Err(ReadError::Endless)));
    }
}
