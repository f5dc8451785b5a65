//! flock-cni: the CNI plugin binary. The runtime passes the verb and the attachment in the
//! environment and the network configuration on stdin; the result or the error object goes
//! to stdout (and nothing else does), logs to stderr.

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let env = flock_cni::env::from_vars(|k| std::env::var(k).ok());
    // Bounded (`plugin::MAX_STDIN`): a larger stdin is an error object, not read on. A read
    // error is treated like empty input and surfaces as a decode error for the verbs that
    // need a config (VERSION may come with nothing on stdin).
    let (out, ok) = match flock_cni::plugin::read_stdin(std::io::stdin().lock()) {
        Ok(stdin) => flock_cni::plugin::outcome(env, &stdin),
        Err(e) => flock_cni::plugin::outcome(Err(e), &[]),
    };
    if let Some(v) = out {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{v}");
        let _ = stdout.flush();
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
