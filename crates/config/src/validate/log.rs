//! `[log]`: where the access log goes, how much of it is kept, and the operational log's
//! format. The defaults live in [`LogConfig::default`].

use super::common::*;

pub(super) fn log(raw: Option<RawLog>, errs: &mut Collector) -> Option<LogConfig> {
    let defaults = LogConfig::default();
    let Some(raw) = raw else {
        return Some(defaults);
    };
    let access = match raw.access.as_deref() {
        None => Some(defaults.access),
        Some("stdout") => Some(AccessLogDest::Stdout),
        Some("off") => Some(AccessLogDest::Off),
        Some("") => {
            errs.push(
                "log.access",
                "`access` is empty",
                "write \"stdout\" (the default), \"off\", or the path of a file to append to, e.g. access = \"/var/log/rolter/access.log\"",
            );
            None
        }
        Some(p) if p.ends_with('/') => {
            errs.push(
                "log.access",
                format!("`access` = \"{p}\" names a directory, not a file"),
                "name the file to append to, e.g. access = \"/var/log/rolter/access.log\"",
            );
            None
        }
        Some(p) => Some(AccessLogDest::File(PathBuf::from(p))),
    };
    let sample = match raw.sample {
        None => Some(defaults.sample),
        Some(s) if (0.0..=1.0).contains(&s) => Some(s),
        Some(s) => {
            errs.push(
                "log.sample",
                format!("`sample` = {s} is outside 0.0 to 1.0"),
                "write the share of successful requests to log, e.g. sample = 0.1 for one in ten (errors are always logged), or 1.0 for all",
            );
            None
        }
    };
    let format = match raw.format.as_deref() {
        None => Some(defaults.format),
        Some("text") => Some(LogFormat::Text),
        Some("json") => Some(LogFormat::Json),
        Some(f) => {
            errs.push(
                "log.format",
                format!("unknown log format \"{f}\""),
                "write format = \"text\" (the default) or format = \"json\"",
            );
            None
        }
    };
    Some(LogConfig {
        access: access?,
        sample: sample?,
        format: format?,
    })
}
