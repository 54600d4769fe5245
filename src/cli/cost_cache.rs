//! Measured cost curves kept between runs, on a CPU (a GPU's passes take milliseconds,
//! and it times its curve at start).
//!
//! Timing t(K)/t(1) at start takes seconds: with the default model on a 2-core CPU,
//! `generate` of 32 tokens took 3.4–4.7 s measuring and 1.0 s with `--cost flat`. The
//! curve depends on the machine, the binary, the model and the settings, not on the
//! request, so a curve measured once is kept in a file and reused by later runs with the
//! same of all of those; each run still corrects it from its own steps
//! (`engine::cost`). `--cost remeasure` times it again and keeps the new one.
//!
//! The file's name is a hash of the key, and the file holds the key itself, which a
//! reader compares whole: a curve is only ever used for the exact binary (its size and
//! modification time), model file (path, size, modification time), weight format,
//! device, threads, CPU, measurement settings and `SUFFIXD_*`/`CANDLE_*` environment it
//! was measured with. A file that cannot be read or does not match is measured over;
//! a cache that cannot be written is skipped with a warning. Nothing here fails a run.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde_json::{Value, json};

use crate::engine::cost::CostCurve;

/// Bumped when the file's fields change meaning.
const FORMAT: u64 = 1;

/// Curves a folder keeps: past this many, the least recently written go when another is
/// written. One binary and model with one setting make one file; a developer's rebuilds
/// make one each, which nothing would ever read again.
const KEEP: usize = 32;

/// The cache's folder: `$SUFFIXD_CACHE_DIR`, else `$XDG_CACHE_HOME/suffixd`, else
/// `~/.cache/suffixd`; None when none of them is set.
pub(super) fn cache_dir() -> Option<PathBuf> {
    let from_env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = from_env("SUFFIXD_CACHE_DIR") {
        return Some(dir.into());
    }
    if let Some(dir) = from_env("XDG_CACHE_HOME") {
        return Some(Path::new(&dir).join("suffixd"));
    }
    from_env("HOME").map(|home| Path::new(&home).join(".cache").join("suffixd"))
}

/// What a measured curve depends on, for a curve of `model` (a path, or a
/// `synthetic:` name) measured by `measurement` (its parameters, as the caller names
/// them) on `device`.
pub(super) fn key(model: &Path, weights: &str, device: &str, measurement: Value) -> Value {
    let file = |path: &Path| -> Value {
        match std::fs::metadata(path) {
            Ok(meta) => json!({
                "path": std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
                "bytes": meta.len(),
                "modified_ns": meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map(|d| d.as_nanos().to_string()),
            }),
            // A synthetic model names no file.
            Err(_) => json!({ "name": path }),
        }
    };
    let binary = std::env::current_exe().map_or(Value::Null, |exe| file(&exe));
    let mut env: Vec<String> = std::env::vars()
        .filter(|(name, _)| {
            (name.starts_with("SUFFIXD_") || name.starts_with("CANDLE_"))
                && name != "SUFFIXD_CACHE_DIR"
        })
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    env.sort();
    json!({
        "format": FORMAT,
        "suffixd": env!("CARGO_PKG_VERSION"),
        "binary": binary,
        "model": file(model),
        "weights": weights,
        "device": device,
        "cpu": cpu_model(),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "env": env,
        "measurement": measurement,
    })
}

/// The CPU's model name as Linux reports it ("" elsewhere): a cache folder shared
/// between machines keeps their curves apart.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_default()
}

/// The file that holds `key`'s curve in `dir`.
fn file_for(dir: &Path, key: &Value) -> PathBuf {
    // SipHash with fixed keys: the same name for the same key in every run of this
    // binary, which is part of the key.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.to_string().hash(&mut hasher);
    dir.join(format!("cost-curve-{:016x}.json", hasher.finish()))
}

/// The curve kept for `key`, if a file for exactly that key holds a valid one.
pub(super) fn load(dir: &Path, key: &Value) -> Option<(CostCurve, PathBuf)> {
    let path = file_for(dir, key);
    let text = std::fs::read_to_string(&path).ok()?;
    match parse(&text, key) {
        Ok(curve) => Some((curve, path)),
        Err(why) => {
            tracing::warn!("ignoring the cost curve cache {}: {why}", path.display());
            None
        }
    }
}

/// A kept curve for `key`, or why `text` is not one.
fn parse(text: &str, key: &Value) -> Result<CostCurve, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
    if v.get("key") != Some(key) {
        return Err("it was measured for another binary, model or setting".into());
    }
    let t1_ms = v.get("t1_ms").and_then(Value::as_f64).unwrap_or(0.0);
    if !(t1_ms.is_finite() && t1_ms > 0.0) {
        return Err("its single-row time is not a positive number".into());
    }
    let points: Vec<(usize, f64)> = v
        .get("points")
        .cloned()
        .map(serde_json::from_value)
        .ok_or("it has no points")?
        .map_err(|e| format!("its points are not pairs of a count and a ratio ({e})"))?;
    // As measured: relative to K = 1 already.
    if CostCurve::check_points(&points).map_err(|e| e.to_string())? != 1.0 {
        return Err("its points do not start at (1, 1)".into());
    }
    Ok(CostCurve::new(points, t1_ms))
}

/// Keep `curve` (as measured: its points before any step corrected them) for `key`,
/// written whole or not at all (a temporary file renamed into place), so that runs
/// starting together read either no file or a complete one. Returns where.
pub(super) fn store(dir: &Path, key: &Value, curve: &CostCurve) -> std::io::Result<PathBuf> {
    let points = curve.measured_points();
    let measured_at = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let text = json!({
        "key": key,
        "t1_ms": curve.t1_ms,
        "points": points,
        "measured_at_unix_s": measured_at,
    })
    .to_string();
    std::fs::create_dir_all(dir)?;
    let path = file_for(dir, key);
    let partial = path.with_extension(format!("{}.partial", std::process::id()));
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, &path).inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })?;
    prune(dir, &path);
    Ok(path)
}

/// Remove all but the [`KEEP`] most recently written curves in `dir` (never `kept`, the
/// one just written), and partial files a run left behind more than an hour ago. Other
/// files are not touched, and what cannot be removed stays.
fn prune(dir: &Path, kept: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let mut curves = Vec::new();
    for entry in entries.flatten() {
        let (path, name) = (entry.path(), entry.file_name());
        let Some(name) = name.to_str().filter(|n| n.starts_with("cost-curve-")) else {
            continue;
        };
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        if name.ends_with(".partial") {
            if now
                .duration_since(modified)
                .is_ok_and(|age| age.as_secs() > 3600)
            {
                let _ = std::fs::remove_file(&path);
            }
        } else if name.ends_with(".json") && path != kept {
            curves.push((modified, path));
        }
    }
    // Newest first: KEEP - 1 of them stay beside the one just written.
    curves.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    for (_, path) in curves.into_iter().skip(KEEP - 1) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured() -> CostCurve {
        CostCurve::new(vec![(1, 1.0), (2, 1.3), (4, 1.9), (8, 3.2)], 4.5)
    }

    fn a_key(weights: &str) -> Value {
        key(
            Path::new("synthetic:llama-3.2-1b"),
            weights,
            "cpu avx2",
            json!({"max_rows": 8}),
        )
    }

    #[test]
    fn a_kept_curve_comes_back_as_measured_for_its_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let curve = measured();
        let path = store(dir.path(), &a_key("native"), &curve).unwrap();
        let (back, from) = load(dir.path(), &a_key("native")).expect("kept");
        assert_eq!(from, path);
        assert_eq!(back.points, curve.points);
        assert_eq!(back.measured, curve.measured);
        assert_eq!(back.t1_ms, curve.t1_ms);
        // Another setting: another file, none there.
        assert!(load(dir.path(), &a_key("f32")).is_none());
        // Only the kept file is left (no partial one).
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_folder_keeps_the_newest_curves_only() {
        let dir = tempfile::tempdir().unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        let aged = |path: &Path| {
            let file = std::fs::File::options().write(true).open(path).unwrap();
            file.set_modified(old).unwrap();
        };
        // Another program's file, and a partial file of a run that died two hours ago.
        let other = dir.path().join("notes.txt");
        std::fs::write(&other, "mine").unwrap();
        let stale = dir.path().join("cost-curve-0123456789abcdef.77.partial");
        std::fs::write(&stale, "{").unwrap();
        aged(&stale);
        let mut written = Vec::new();
        for model in 0..KEEP + 5 {
            let key = key(
                Path::new(&format!("synthetic:model-{model}")),
                "native",
                "cpu",
                json!({}),
            );
            written.push((store(dir.path(), &key, &measured()).unwrap(), key));
            // The first five are the oldest by far.
            if model < 5 {
                aged(&written[model].0);
            }
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(names.len(), KEEP + 1, "{names:?}");
        assert!(other.exists() && !stale.exists());
        for (i, (path, key)) in written.iter().enumerate() {
            assert_eq!(path.exists(), i >= 5, "{}", path.display());
            assert_eq!(load(dir.path(), key).is_some(), i >= 5);
        }
    }

    #[test]
    fn a_damaged_or_foreign_file_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let key = a_key("native");
        let path = store(dir.path(), &key, &measured()).unwrap();
        let good = std::fs::read_to_string(&path).unwrap();
        let other_key = good.replace("\"native\"", "\"q8-0\"");
        let bad_points = good.replace("[1,1.0]", "[1,0.5]");
        let no_time = good.replace("\"t1_ms\":4.5", "\"t1_ms\":0.0");
        for text in [
            &good[..good.len() / 2],
            "",
            &other_key,
            &bad_points,
            &no_time,
        ] {
            assert_ne!(text, good);
            std::fs::write(&path, text).unwrap();
            assert!(load(dir.path(), &key).is_none(), "{text}");
        }
    }

    #[test]
    fn a_changed_model_file_has_another_key() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.gguf");
        std::fs::write(&model, b"weights").unwrap();
        let key_of = || key(&model, "native", "cpu", json!({}));
        let before = key_of();
        assert_eq!(before, key_of(), "the same file, the same key");
        std::fs::write(&model, b"other weights").unwrap();
        assert_ne!(before, key_of());
        assert!(
            before["env"]
                .as_array()
                .unwrap()
                .iter()
                .all(|e| !e.as_str().unwrap().starts_with("SUFFIXD_CACHE_DIR=")),
            "where the cache is is not part of what it holds"
        );
    }
}
