//! flock-cni: the CNI plugin binary. The runtime passes the verb and the attachment in the
//! environment and the network configuration on stdin; the result or the error object goes
//! to stdout (and nothing else does), logs to stderr.

use std::io::{Read, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut stdin = Vec::new();
    // VERSION may come with nothing on stdin; a read error is treated like empty input and
    // surfaces as a decode error for the verbs that need a config.
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let env = flock_cni::env::from_vars(|k| std::env::var(k).ok());
    let (out, ok) = flock_cni::plugin::outcome(env, &stdin);
    if let Some(v) = out {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{v}");
        let _ = stdout.flush();
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
