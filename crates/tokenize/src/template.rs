//! Chat templates the way the engine renders them.
//!
//! Owns two things the engine does before it tokenizes a chat request:
//!
//! 1. The Jinja environment of Hugging Face `transformers` (`apply_chat_template`):
//!    `trim_blocks` and `lstrip_blocks` on, loop controls (`break` / `continue`), the globals
//!    `raise_exception(msg)` and `strftime_now(fmt)`, and a `tojson` filter that writes what
//!    Python's `json.dumps(x, ensure_ascii=False)` writes (`", "` and `": "` separators, key
//!    order kept, `indent=`, `separators=`, `sort_keys=`, `ensure_ascii=` honoured), because
//!    templates such as Qwen2.5's put `tool | tojson` straight into the prompt. Python string
//!    and dict methods (`.strip()`, `.split()`, `.startswith()`, `.items()`, `.get()` ...)
//!    come from `minijinja-contrib`'s pycompat layer.
//! 2. vLLM's message normalisation (`parse_chat_messages`): content parts are reduced to a
//!    string for templates that expect one (text parts joined with `"\n"`, a placeholder per
//!    media part put in front, see [`MediaPlaceholders`]) or to `{"type": ...}` dicts for
//!    templates that loop over the parts; tool-call `arguments` strings are parsed to JSON;
//!    tools are laid out as vLLM's request model dumps them.
//!
//! Must not: tokenize, read files, or touch the network. `strftime_now` reads the clock (UTC,
//! as engine containers normally run); a template that uses it makes prompts change daily, so
//! pass `date_string` through `chat_template_kwargs` when that matters.
//!
//! Not supported: the `{% generation %}` tag of some training templates (a compile error),
//! `continue_final_message`, and Jinja features minijinja lacks (see its compatibility notes).

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

use super::TokenizeError;

/// The name the chat template is registered under in the environment.
pub const TEMPLATE_NAME: &str = "chat_template";

/// Builds the environment with the `transformers` settings and the given template source.
///
/// `origin` names where the template came from, for the error message.
pub fn environment(source: String, origin: &str) -> Result<Environment<'static>, TokenizeError> {
    let mut env = Environment::new();
    let mut syntax = minijinja::syntax::SyntaxConfig::builder();
    syntax.trim_blocks(true).lstrip_blocks(true);
    env.set_syntax(syntax.build().map_err(|e| TokenizeError::TemplateSyntax {
        origin: origin.to_string(),
        message: e.to_string(),
    })?);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson_filter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_template_owned(TEMPLATE_NAME, source)
        .map_err(|e| TokenizeError::TemplateSyntax {
            origin: origin.to_string(),
            message: describe(&e),
        })?;
    Ok(env)
}

/// An error's text with its template line, when known.
pub fn describe(e: &Error) -> String {
    let mut s = match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        let _ = write!(s, " (line {line})");
    }
    s
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime_utc(secs, &format)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `time.strftime` for a UTC instant, with the C-locale directives templates use:
/// `%d %m %Y %y %b %B %a %A %H %M %S %j %e %%`. Others are written back unchanged.
pub fn strftime_utc(unix_secs: u64, format: &str) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = ((days % 7 + 7 + 3) % 7) as usize;
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let mut out = String::with_capacity(format.len() + 8);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('m') => write!(out, "{month:02}"),
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('b') => write!(out, "{}", &MONTHS[month as usize - 1][..3]),
            Some('B') => write!(out, "{}", MONTHS[month as usize - 1]),
            Some('a') => write!(out, "{}", &WEEKDAYS[weekday][..3]),
            Some('A') => write!(out, "{}", WEEKDAYS[weekday]),
            Some('H') => write!(out, "{:02}", rem / 3600),
            Some('M') => write!(out, "{:02}", rem / 60 % 60),
            Some('S') => write!(out, "{:02}", rem % 60),
            Some('j') => write!(out, "{yday:03}"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

// ---------------------------------------------------------------------------------------------
// tojson, as Python's json.dumps
// ---------------------------------------------------------------------------------------------

/// Layout options of Python's `json.dumps`.
#[derive(Debug, Clone)]
pub struct PyJson {
    /// `None` is one line; `Some(n)` puts each item on its own line, indented by `n` spaces.
    pub indent: Option<usize>,
    /// Item separator (`", "` on one line, `","` when indented).
    pub item_sep: String,
    /// Key separator (`": "`).
    pub key_sep: String,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

impl Default for PyJson {
    /// What `transformers`' `tojson` filter passes: `json.dumps(x, ensure_ascii=False)`.
    fn default() -> Self {
        PyJson {
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
            ensure_ascii: false,
        }
    }
}

fn tojson_filter(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let mut opts = PyJson::default();
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    if let Some(indent) = indent {
        if let Some(n) = indent.as_i64() {
            opts.indent = Some(n.max(0) as usize);
            opts.item_sep = ",".into();
        } else if !indent.is_none() {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: indent must be an integer",
            ));
        }
    }
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")? {
        if !seps.is_none() {
            let item = seps.get_item_by_index(0)?;
            let key = seps.get_item_by_index(1)?;
            match (item.as_str(), key.as_str()) {
                (Some(i), Some(k)) => {
                    opts.item_sep = i.to_string();
                    opts.key_sep = k.to_string();
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
    }
    if let Some(b) = kwargs.get::<Option<bool>>("sort_keys")? {
        opts.sort_keys = b;
    }
    if let Some(b) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        opts.ensure_ascii = b;
    }
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_py_json(&mut out, value, &opts, 0)?;
    Ok(Value::from(out))
}

/// Writes `value` as Python's `json.dumps` with `opts` would.
pub fn write_py_json(
    out: &mut String,
    value: &Value,
    opts: &PyJson,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_py_number(out, value),
        ValueKind::String => write_py_str(out, value.as_str().unwrap_or_default(), opts),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, '[', ']', items.len(), opts, depth, |out, i| {
                write_py_json(out, &items[i], opts, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
            }
            write_container(out, '{', '}', keys.len(), opts, depth, |out, i| {
                let key = &keys[i];
                match key.as_str() {
                    Some(s) => write_py_str(out, s, opts),
                    None => write_py_str(out, &key.to_string(), opts),
                }
                out.push_str(&opts.key_sep);
                write_py_json(out, &value.get_item(key)?, opts, depth + 1)
            })?;
        }
        ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {} is not JSON serializable", value.kind()),
            ))
        }
        _ => write_py_str(out, &value.to_string(), opts),
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    open: char,
    close: char,
    len: usize,
    opts: &PyJson,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&opts.item_sep);
        }
        if let Some(n) = opts.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * (depth + 1)));
        }
        item(out, i)?;
    }
    if let Some(n) = opts.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * depth));
    }
    out.push(close);
    Ok(())
}

/// Integers as digits; floats as Python's `repr` (`1.0`, `1e+16`, `1e-05`).
fn write_py_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        let s = format!("{f:?}");
        match s.split_once('e') {
            Some((mantissa, exp)) => {
                let (sign, digits) = match exp.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', exp),
                };
                let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
            }
            None => out.push_str(&s),
        }
    }
}

fn write_py_str(out: &mut String, s: &str, opts: &PyJson) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if opts.ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------------------
// Message normalisation, as vLLM's parse_chat_messages
// ---------------------------------------------------------------------------------------------

/// How a template wants `message.content`: vLLM's "string" and "openai" content formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// A string: text parts joined with `"\n"`, media placeholders in front.
    String,
    /// A list of `{"type": "text", "text": ...}` / `{"type": "image"}` dicts.
    OpenAi,
}

/// Guesses the content format from the template source, as vLLM's "auto" does: a template
/// that loops over a message's `content` (`{% for part in message['content'] %}`) wants
/// parts, any other wants a string.
pub fn detect_content_format(source: &str) -> ContentFormat {
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("%}") else { break };
        let tag = after[..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        rest = &after[end + 2..];
        let Some(body) = tag.strip_prefix("for ") else {
            continue;
        };
        let Some((_, iterable)) = body.split_once(" in ") else {
            continue;
        };
        let iterable = iterable
            .split(['|', ' '])
            .next()
            .unwrap_or_default()
            .trim_end_matches(['\'', '"', ']', ')']);
        if iterable.ends_with("content") && iterable != "contents" {
            return ContentFormat::OpenAi;
        }
    }
    ContentFormat::String
}

/// Text put in the prompt for a media content part in the string content format. The engine
/// uses a model-specific placeholder (and later expands it to many tokens), so ids after a
/// media part will not match the engine's; the defaults only keep the text around it stable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaPlaceholders {
    pub image: String,
    pub audio: String,
    pub video: String,
}

impl Default for MediaPlaceholders {
    fn default() -> Self {
        MediaPlaceholders {
            image: "<image>".into(),
            audio: "<audio>".into(),
            video: "<video>".into(),
        }
    }
}

#[derive(Clone, Copy)]
enum Media {
    Image,
    Audio,
    Video,
}

impl Media {
    fn name(self) -> &'static str {
        match self {
            Media::Image => "image",
            Media::Audio => "audio",
            Media::Video => "video",
        }
    }
}

enum Part {
    Text(Value),
    Media(Media),
    /// A part without useful content (`{"type": "text", "text": null}`): skipped.
    Skip,
}

fn classify_part(part: &Value) -> Result<Part, TokenizeError> {
    if part.kind() == ValueKind::String {
        return Ok(Part::Text(part.clone()));
    }
    if part.kind() != ValueKind::Map {
        return Err(TokenizeError::request(format!(
            "content part must be a string or an object, got {}",
            part.kind()
        )));
    }
    let get = |key: &str| part.get_attr(key).ok().filter(|v| !v.is_undefined());
    let text_of = |key: &str| match get(key) {
        Some(v) if v.kind() == ValueKind::String => Part::Text(v),
        _ => Part::Skip,
    };
    let Some(kind) = get("type").filter(|v| !v.is_none()) else {
        // vLLM accepts parts with no "type" that carry a media field directly.
        for (key, media) in [
            ("image_url", Media::Image),
            ("image_pil", Media::Image),
            ("image_embeds", Media::Image),
            ("audio_url", Media::Audio),
            ("input_audio", Media::Audio),
            ("audio_embeds", Media::Audio),
            ("video_url", Media::Video),
        ] {
            if get(key).is_some() {
                return Ok(Part::Media(media));
            }
        }
        return Err(TokenizeError::request("content part without a \"type\""));
    };
    Ok(match kind.as_str().unwrap_or_default() {
        "text" | "input_text" | "output_text" => text_of("text"),
        "refusal" => text_of("refusal"),
        "thinking" => text_of("thinking"),
        "image_url" | "input_image" | "image_embeds" | "image_pil" => Part::Media(Media::Image),
        "audio_url" | "input_audio" | "audio_embeds" => Part::Media(Media::Audio),
        "video_url" => Part::Media(Media::Video),
        other => {
            return Err(TokenizeError::request(format!(
                "unsupported content part type {other:?}"
            )))
        }
    })
}

/// The conversation the template sees: each message normalised as vLLM does.
pub fn conversation(
    messages: &Value,
    format: ContentFormat,
    placeholders: &MediaPlaceholders,
) -> Result<Value, TokenizeError> {
    if messages.kind() != ValueKind::Seq {
        return Err(TokenizeError::request("messages must be an array"));
    }
    let mut out = Vec::with_capacity(messages.len().unwrap_or(0));
    for (index, message) in messages
        .try_iter()
        .map_err(|e| TokenizeError::request(e.to_string()))?
        .enumerate()
    {
        out.push(
            normalise_message(&message, format, placeholders).map_err(|e| match e {
                TokenizeError::Request { message } => {
                    TokenizeError::request(format!("messages[{index}]: {message}"))
                }
                other => other,
            })?,
        );
    }
    Ok(Value::from(out))
}

fn field(map: &Value, key: &str) -> Option<Value> {
    map.get_attr(key).ok().filter(|v| !v.is_undefined())
}

fn normalise_message(
    message: &Value,
    format: ContentFormat,
    placeholders: &MediaPlaceholders,
) -> Result<Value, TokenizeError> {
    if message.kind() != ValueKind::Map {
        return Err(TokenizeError::request("a message must be an object"));
    }
    let role = field(message, "role")
        .filter(|r| r.kind() == ValueKind::String)
        .ok_or_else(|| TokenizeError::request("a message needs a string \"role\""))?;
    let role_str = role.as_str().unwrap_or_default().to_string();

    let content = field(message, "content").unwrap_or(Value::from(()));
    let mut parts = Vec::new();
    match content.kind() {
        ValueKind::None => {}
        ValueKind::String => parts.push(Part::Text(content.clone())),
        ValueKind::Seq => {
            for part in content
                .try_iter()
                .map_err(|e| TokenizeError::request(e.to_string()))?
            {
                parts.push(classify_part(&part)?);
            }
        }
        other => {
            return Err(TokenizeError::request(format!(
                "content must be a string, an array or null, got {other}"
            )))
        }
    }

    let mut content_value = match format {
        ContentFormat::String => Value::from(join_string_content(&parts, placeholders)),
        ContentFormat::OpenAi => Value::from(
            parts
                .iter()
                .filter_map(|p| match p {
                    Part::Text(t) => Some(Value::from_pairs([
                        ("type", Value::from("text")),
                        ("text", t.clone()),
                    ])),
                    Part::Media(m) => Some(Value::from_pairs([("type", Value::from(m.name()))])),
                    Part::Skip => None,
                })
                .collect::<Vec<_>>(),
        ),
    };

    let mut pairs: Vec<(&str, Value)> = Vec::with_capacity(6);
    match role_str.as_str() {
        "assistant" => {
            let tool_calls = field(message, "tool_calls").filter(|v| !v.is_none());
            let reasoning = field(message, "reasoning").filter(|v| !v.is_none());
            pairs.push(("role", role));
            pairs.push(("content", content_value));
            if let Some(calls) = tool_calls {
                if let Some(calls) = normalise_tool_calls(&calls)? {
                    pairs.push(("tool_calls", calls));
                }
            }
            if let Some(r) = reasoning {
                pairs.push(("reasoning", r.clone()));
                pairs.push(("reasoning_content", r));
            }
        }
        "tool" => {
            // Tool results given as text parts become one string even for templates that
            // take parts (vLLM: most templates only handle string tool content).
            if format == ContentFormat::OpenAi && parts.iter().all(|p| !matches!(p, Part::Media(_)))
            {
                content_value = Value::from(join_string_content(&parts, placeholders));
            }
            pairs.push(("role", role));
            pairs.push(("content", content_value));
            if let Some(id) = field(message, "tool_call_id") {
                pairs.push(("tool_call_id", id));
            }
        }
        _ => {
            pairs.push(("role", role));
            pairs.push(("content", content_value));
        }
    }
    if let Some(name) = field(message, "name").filter(|v| v.kind() == ValueKind::String) {
        pairs.push(("name", name));
    }
    if role_str == "developer" {
        pairs.push(("tools", field(message, "tools").unwrap_or(Value::from(()))));
    }
    Ok(Value::from_pairs(pairs))
}

fn join_string_content(parts: &[Part], placeholders: &MediaPlaceholders) -> String {
    let mut text = String::new();
    let mut first = true;
    for part in parts {
        if let Part::Text(t) = part {
            if !first {
                text.push('\n');
            }
            first = false;
            text.push_str(t.as_str().unwrap_or_default());
        }
    }
    let mut media: Vec<&str> = Vec::new();
    for part in parts {
        if let Part::Media(m) = part {
            media.push(match m {
                Media::Image => &placeholders.image,
                Media::Audio => &placeholders.audio,
                Media::Video => &placeholders.video,
            });
        }
    }
    if media.is_empty() {
        return text;
    }
    let mut out = media.join("\n");
    if !first {
        out.push('\n');
        out.push_str(&text);
    }
    out
}

/// Tool calls with `function.arguments` parsed from its JSON string (`{}` when it is not
/// JSON or not given); `None` for an empty list, which vLLM drops.
fn normalise_tool_calls(calls: &Value) -> Result<Option<Value>, TokenizeError> {
    if calls.kind() != ValueKind::Seq {
        return Ok(Some(calls.clone()));
    }
    if calls.len() == Some(0) {
        return Ok(None);
    }
    let mut out = Vec::new();
    for call in calls
        .try_iter()
        .map_err(|e| TokenizeError::request(e.to_string()))?
    {
        let function = field(&call, "function").filter(|f| f.kind() == ValueKind::Map);
        let Some(function) = function else {
            return Err(TokenizeError::request(
                "a tool call needs a \"function\" object",
            ));
        };
        let arguments = match field(&function, "arguments") {
            Some(a) if a.kind() == ValueKind::String => {
                serde_json::from_str::<Value>(a.as_str().unwrap_or_default())
                    .unwrap_or_else(|_| empty_map())
            }
            Some(a) if matches!(a.kind(), ValueKind::Map | ValueKind::Seq) => a,
            _ => empty_map(),
        };
        let function = replace_key(&function, "arguments", arguments);
        out.push(replace_key(&call, "function", function));
    }
    Ok(Some(Value::from(out)))
}

fn empty_map() -> Value {
    Value::from_pairs(std::iter::empty::<(Value, Value)>())
}

/// A copy of map `v` with `key` set to `new`, in the key's old place (or at the end).
fn replace_key(v: &Value, key: &str, new: Value) -> Value {
    let mut pairs: Vec<(Value, Value)> = Vec::new();
    let mut seen = false;
    if let Ok(keys) = v.try_iter() {
        for k in keys {
            if k.as_str() == Some(key) {
                pairs.push((k, new.clone()));
                seen = true;
            } else {
                let item = v.get_item(&k).unwrap_or(Value::from(()));
                pairs.push((k, item));
            }
        }
    }
    if !seen {
        pairs.push((Value::from(key), new));
    }
    Value::from_pairs(pairs)
}

/// Tools laid out as vLLM's request model dumps them (`tool.model_dump()`):
/// `{"type", "function": {"name", "description", "parameters", ...extra}, ...extra}` with
/// `null` for a missing description or parameters.
pub fn normalise_tools(tools: &Value) -> Result<Value, TokenizeError> {
    if tools.is_none() {
        return Ok(Value::from(()));
    }
    if tools.kind() != ValueKind::Seq {
        return Err(TokenizeError::request("tools must be an array"));
    }
    let mut out = Vec::new();
    for (index, tool) in tools
        .try_iter()
        .map_err(|e| TokenizeError::request(e.to_string()))?
        .enumerate()
    {
        let function = field(&tool, "function")
            .filter(|f| f.kind() == ValueKind::Map)
            .ok_or_else(|| {
                TokenizeError::request(format!("tools[{index}] needs a \"function\" object"))
            })?;
        let name = field(&function, "name")
            .filter(|n| n.kind() == ValueKind::String)
            .ok_or_else(|| {
                TokenizeError::request(format!("tools[{index}].function needs a string \"name\""))
            })?;
        let mut fpairs: Vec<(Value, Value)> = vec![
            (Value::from("name"), name),
            (
                Value::from("description"),
                field(&function, "description").unwrap_or(Value::from(())),
            ),
            (
                Value::from("parameters"),
                field(&function, "parameters").unwrap_or(Value::from(())),
            ),
        ];
        extend_extra(
            &mut fpairs,
            &function,
            &["name", "description", "parameters"],
        );
        let mut tpairs: Vec<(Value, Value)> = vec![
            (
                Value::from("type"),
                field(&tool, "type").unwrap_or(Value::from("function")),
            ),
            (Value::from("function"), Value::from_pairs(fpairs)),
        ];
        extend_extra(&mut tpairs, &tool, &["type", "function"]);
        out.push(Value::from_pairs(tpairs));
    }
    Ok(Value::from(out))
}

fn extend_extra(pairs: &mut Vec<(Value, Value)>, map: &Value, known: &[&str]) {
    if let Ok(keys) = map.try_iter() {
        for k in keys {
            if k.as_str().is_some_and(|s| known.contains(&s)) {
                continue;
            }
            let item = map.get_item(&k).unwrap_or(Value::from(()));
            pairs.push((k, item));
        }
    }
}

#[cfg(test)]
mod tests;
