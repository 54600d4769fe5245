//! Token-stream files: JSON Lines, optionally zstd-compressed, one example a line:
//! `{"prompt": [u32…], "response": [u32…]}`. Extra keys are ignored.
//!
//! Files are streamed line by line and never loaded whole. Compression is recognised
//! by the zstd magic number, not the file name.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub mod logs;

/// One example of a token-stream file.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct TokenExample {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Response token ids.
    pub response: Vec<u32>,
}

/// Errors from reading a token-stream file.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A line longer than any record (an endless line would be read until memory ran
    /// out).
    #[error(
        "{path}:{line}: a line longer than {limit} bytes, more than any record; is this a log of JSON lines?"
    )]
    LineTooLong {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The longest line read, in bytes.
        limit: usize,
    },
    /// A line is not a token example.
    #[error(
        "{path}:{line}: not a token example ({source}); each line must be \
         {{\"prompt\": [ids], \"response\": [ids]}} with ids in 0..2^32"
    )]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What the parser said.
        source: serde_json::Error,
    },
    /// A line of a log is none of the three log shapes.
    #[error(
        "{path}:{line}: not a log record ({source}); each line must hold token ids \
         {{\"prompt\": [ids], \"response\": [ids]}}, text {{\"prompt\": \"…\", \"response\": \"…\"}} \
         or a chat record {{\"messages\": [...]}}"
    )]
    Log {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What the parser said.
        source: serde_json::Error,
    },
}

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Open a file for line reading, decompressing zstd transparently.
pub fn open_lines(path: &Path) -> Result<Box<dyn BufRead + Send>, std::io::Error> {
    let mut file = crate::files::open_regular(path, "request log")?;
    let mut magic = [0u8; 4];
    let n = read_up_to(&mut file, &mut magic)?;
    let head = std::io::Cursor::new(magic[..n].to_vec());
    let chained = head.chain(file);
    if n == 4 && magic == ZSTD_MAGIC {
        Ok(Box::new(BufReader::with_capacity(
            1 << 16,
            zstd::Decoder::new(chained)?,
        )))
    } else {
        Ok(Box::new(BufReader::with_capacity(1 << 16, chained)))
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Stream the non-blank lines of a JSON Lines file (plain or zstd) parsed as `T`;
/// `parse_error` turns a bad line (1-based number) into the caller's error.
pub(crate) fn read_json_lines<T: serde::de::DeserializeOwned>(
    path: &Path,
    parse_error: fn(PathBuf, usize, serde_json::Error) -> CorpusError,
) -> Result<impl Iterator<Item = Result<T, CorpusError>>, CorpusError> {
    let reader = open_lines(path).map_err(|source| CorpusError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let path = path.to_path_buf();
    Ok(BoundedLines::new(reader, MAX_LINE_BYTES)
        .filter(|l| l.as_ref().map_or(true, |(_, s)| !s.trim().is_empty()))
        .map(move |line| {
            let (number, line) = line.map_err(|e| match e {
                LineError::Io(source) => CorpusError::Io {
                    path: path.clone(),
                    source,
                },
                LineError::TooLong { line, limit } => CorpusError::LineTooLong {
                    path: path.clone(),
                    line,
                    limit,
                },
            })?;
            serde_json::from_str::<T>(&line).map_err(|e| parse_error(path.clone(), number, e))
        }))
}

/// Longest line a log or token-stream file may hold, in bytes: far more than any
/// record (a 128k-token conversation is under 1 MB), and a bound on what one line costs.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// Why a line could not be read.
#[derive(Debug)]
enum LineError {
    Io(std::io::Error),
    /// Line `line` (1-based) runs past `limit` bytes.
    TooLong {
        line: usize,
        limit: usize,
    },
}

/// The lines of a reader with their 1-based numbers, as `BufRead::lines` gives them
/// (without `\n` or `\r\n`), but never longer than `limit` bytes: a longer line is an
/// error, and the iterator ends after it.
struct BoundedLines<R> {
    reader: R,
    limit: usize,
    number: usize,
    done: bool,
}

impl<R: BufRead> BoundedLines<R> {
    fn new(reader: R, limit: usize) -> Self {
        BoundedLines {
            reader,
            limit,
            number: 0,
            done: false,
        }
    }
}

impl<R: BufRead> Iterator for BoundedLines<R> {
    type Item = Result<(usize, String), LineError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        self.number += 1;
        let mut buf = Vec::new();
        // One byte past the limit tells a line of exactly `limit` bytes from a longer one.
        let read = (&mut self.reader)
            .take(self.limit as u64 + 1)
            .read_until(b'\n', &mut buf);
        match read {
            Err(e) => {
                self.done = true;
                Some(Err(LineError::Io(e)))
            }
            Ok(0) => None,
            Ok(_) => {
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                    if buf.last() == Some(&b'\r') {
                        buf.pop();
                    }
                } else if buf.len() > self.limit {
                    self.done = true;
                    return Some(Err(LineError::TooLong {
                        line: self.number,
                        limit: self.limit,
                    }));
                }
                Some(
                    String::from_utf8(buf)
                        .map(|s| (self.number, s))
                        .map_err(|e| {
                            LineError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
                        }),
                )
            }
        }
    }
}

/// Stream the examples of a token-stream file, at most `limit` of them.
pub fn read_examples(
    path: &Path,
    limit: Option<usize>,
) -> Result<impl Iterator<Item = Result<TokenExample, CorpusError>>, CorpusError> {
    let examples = read_json_lines(path, |path, line, source| CorpusError::Parse {
        path,
        line,
        source,
    })?;
    Ok(examples.take(limit.unwrap_or(usize::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Lines as `BufRead::lines` reads them, until one runs past the limit: an error
    /// naming it, then the end.
    #[test]
    fn lines_are_bounded() {
        let text = b"ab\r\n\ncdef\nghijklmnop\nq";
        let read = |limit| -> Vec<Result<(usize, String), String>> {
            BoundedLines::new(&text[..], limit)
                .map(|l| {
                    l.map_err(|e| match e {
                        LineError::TooLong { line, limit } => format!("{line} > {limit}"),
                        LineError::Io(e) => e.to_string(),
                    })
                })
                .collect()
        };
        let ok = |n, s: &str| Ok((n, s.to_string()));
        let all = vec![
            ok(1, "ab"),
            ok(2, ""),
            ok(3, "cdef"),
            ok(4, "ghijklmnop"),
            ok(5, "q"),
        ];
        assert_eq!(read(10), all);
        assert_eq!(read(1000), all);
        assert_eq!(
            read(9),
            vec![
                ok(1, "ab"),
                ok(2, ""),
                ok(3, "cdef"),
                Err("4 > 9".to_string())
            ]
        );
        let lines: Vec<String> = std::io::BufRead::lines(&text[..])
            .map(Result::unwrap)
            .collect();
        assert_eq!(lines, ["ab", "", "cdef", "ghijklmnop", "q"]);
    }

    #[test]
    fn reads_plain_and_zstd_and_ignores_extra_keys() {
        let dir = tempfile::tempdir().unwrap();
        let text = "{\"id\": 3, \"prompt\": [1, 2], \"response\": [3]}\n\n{\"prompt\": [], \"response\": [4294967295]}\n";
        let plain = dir.path().join("a.jsonl");
        std::fs::write(&plain, text).unwrap();
        let zst = dir.path().join("a.bin");
        let mut enc = zstd::Encoder::new(std::fs::File::create(&zst).unwrap(), 3).unwrap();
        enc.write_all(text.as_bytes()).unwrap();
        enc.finish().unwrap();
        for p in [&plain, &zst] {
            let ex: Vec<_> = read_examples(p, None)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(ex.len(), 2);
            assert_eq!(ex[0].prompt, vec![1, 2]);
            assert_eq!(ex[1].response, vec![u32::MAX]);
        }
        assert_eq!(read_examples(&plain, Some(1)).unwrap().count(), 1);
    }

    #[test]
    fn bad_lines_and_missing_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.jsonl");
        std::fs::write(
            &p,
            "{\"prompt\": [1], \"response\": [2]}\n{\"prompt\": [-1], \"response\": []}\n",
        )
        .unwrap();
        let err = read_examples(&p, None)
            .unwrap()
            .nth(1)
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("bad.jsonl:2"), "{err}");
        let missing = read_examples(&dir.path().join("nope"), None).err().unwrap();
        assert!(missing.to_string().contains("cannot read"), "{missing}");
    }
}
