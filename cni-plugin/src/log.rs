//! Logging for the plugin: stderr (never stdout, which carries only the result or the error)
//! and, when the config names one, a log file. Set up once per invocation from the config.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use crate::spec::NetConf;

static INIT: OnceLock<()> = OnceLock::new();

#[derive(Clone)]
struct Tee {
    file: Option<Arc<Mutex<File>>>,
}

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        if let Some(f) = &self.file
            && let Ok(mut f) = f.lock()
        {
            let _ = f.write_all(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Installs a stderr-only logger at `info` unless [`init`] already ran (errors that happen
/// before the config is read are still logged).
pub fn ensure() {
    if INIT.get().is_none() {
        install(tracing::Level::INFO, None);
    }
}

/// Installs the logger (once): level from `logLevel` (default `info`), stderr plus
/// `logFile`. A log file that cannot be opened is reported on stderr and skipped.
pub fn init(conf: &NetConf) {
    if INIT.get().is_some() {
        return;
    }
    let level = match conf.log_level.as_deref() {
        Some("error") => tracing::Level::ERROR,
        Some("warn" | "warning") => tracing::Level::WARN,
        Some("debug") => tracing::Level::DEBUG,
        Some("trace") => tracing::Level::TRACE,
        _ => tracing::Level::INFO,
    };
    let file = conf.log_file.as_ref().and_then(|p| match OpenOptions::new().create(true).append(true).open(p) {
        Ok(f) => Some(Arc::new(Mutex::new(f))),
        Err(e) => {
            eprintln!("flock-cni: cannot open log file {}: {e}", p.display());
            None
        }
    });
    install(level, file);
}

fn install(level: tracing::Level, file: Option<Arc<Mutex<File>>>) {
    let _ = INIT.set(());
    let tee = Tee { file };
    let _ = tracing_subscriber::fmt().with_max_level(level).with_ansi(false).with_target(false).with_writer(move || tee.clone()).try_init();
}
