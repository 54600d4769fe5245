//! Opening the files an operator names (models, configs, request logs, the store's own
//! files): regular files only. Opening a FIFO for reading waits for a writer that may
//! never come, and a device such as `/dev/zero` reads without end; either is refused
//! with an error that says what the path is, before anything is opened.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// An error unless `path` is a regular file (or a link to one). `what` names what it
/// should be, for the message. A missing file is `NotFound`, as opening it would be.
pub fn check_regular(path: &Path, what: &str) -> io::Result<()> {
    let kind = std::fs::metadata(path)?.file_type();
    if kind.is_file() {
        return Ok(());
    }
    let is = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "something else"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{is}, not a regular file, so not a {what}: give the path of a regular file, or move this aside"
        ),
    ))
}

/// An error if something other than a regular file is at `path`; nothing there is
/// fine (for a file about to be created).
pub fn check_regular_if_any(path: &Path, what: &str) -> io::Result<()> {
    match check_regular(path, what) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// `path` opened for reading, once [`check_regular`] passes.
pub fn open_regular(path: &Path, what: &str) -> io::Result<File> {
    check_regular(path, what)?;
    File::open(path)
}

/// The whole text of `path`, once [`check_regular`] passes.
pub fn read_regular_to_string(path: &Path, what: &str) -> io::Result<String> {
    check_regular(path, what)?;
    std::fs::read_to_string(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_open() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, "text").unwrap();
        assert_eq!(read_regular_to_string(&file, "config").unwrap(), "text");
        let fifo = tmp.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for (path, is) in [
            (fifo.as_path(), "a FIFO"),
            (tmp.path(), "a directory"),
            (Path::new("/dev/zero"), "a device"),
        ] {
            let e = open_regular(path, "model").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().starts_with(is), "{e}");
            assert!(check_regular_if_any(path, "model").is_err());
        }
        let missing = tmp.path().join("missing");
        assert_eq!(
            open_regular(&missing, "model").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert!(check_regular_if_any(&missing, "model").is_ok());
    }
}
