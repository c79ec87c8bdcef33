//! The two encodings of one OTLP message, driven by [`crate::schema`]:
//! [`check`] walks protobuf bytes and refuses what a strict decoder would
//! (wrong wire types, invalid UTF-8, ids of the wrong length, nesting
//! past [`DEPTH_MAX`]); [`to_json`] writes OTLP/JSON (lowerCamelCase
//! names, hex ids, 64-bit integers as strings, enums as numbers) and
//! [`from_json`] reads it back into protobuf (either name form, integers
//! as numbers or strings, enums as numbers or names, unknown fields and
//! `null` ignored), as the OTLP specification asks of receivers.

use base64::Engine as _;
use serde_json::Value as Json;

use crate::schema::{push_camel, FieldDef, Kind, Msg};
use crate::wire::{self, put_len, put_tag, put_varint, Reader, Value};
use crate::Error;

/// The deepest nesting of messages accepted (AnyValue nests through
/// arrays and key-value lists without limit in the schema).
pub const DEPTH_MAX: usize = 64;

/// Checks that `bytes` decode as `msg`.
pub fn check(msg: &'static Msg, bytes: &[u8]) -> Result<(), Error> {
    check_at(msg, bytes, 0)
}

fn check_at(msg: &'static Msg, bytes: &[u8], depth: usize) -> Result<(), Error> {
    if depth > DEPTH_MAX {
        return Err(Error::malformed(format!(
            "{}: nested deeper than {DEPTH_MAX} messages",
            msg.name
        )));
    }
    let mut r = Reader::new(bytes);
    while let Some(field) = r.next_field()? {
        let Some(def) = msg.by_number(field.number) else {
            continue; // unknown fields are kept, as proto3 does
        };
        check_value(msg, def, field.value, depth)?;
    }
    Ok(())
}

fn check_value(msg: &Msg, def: &FieldDef, v: Value<'_>, depth: usize) -> Result<(), Error> {
    let wrong = || {
        Error::malformed(format!(
            "{}.{}: wire type {} does not fit a {:?}",
            msg.name,
            def.name,
            v.wire_type(),
            kind_name(def.kind)
        ))
    };
    match (def.kind, v) {
        (Kind::Message(m), Value::Len(b)) => check_at(m, b, depth + 1),
        (Kind::String, Value::Len(b)) => std::str::from_utf8(b)
            .map(|_| ())
            .map_err(|_| Error::malformed(format!("{}.{}: not valid UTF-8", msg.name, def.name))),
        (Kind::Bytes, Value::Len(_)) => Ok(()),
        (Kind::Id(n), Value::Len(b)) => {
            if b.is_empty() || b.len() == n {
                Ok(())
            } else {
                Err(Error::malformed(format!(
                    "{}.{}: {} bytes, an id has {n}",
                    msg.name,
                    def.name,
                    b.len()
                )))
            }
        }
        (k, Value::Len(b)) if def.repeated && packable(k) => {
            for_each_packed(k, b, |_| Ok(())).map_err(|_| wrong())
        }
        (k, v) if scalar_fits(k, v) => Ok(()),
        _ => Err(wrong()),
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Message(m) => m.name,
        Kind::String => "string",
        Kind::Bytes => "bytes",
        Kind::Id(_) => "id",
        Kind::Bool => "bool",
        Kind::Int64 => "int64",
        Kind::Uint64 => "uint64",
        Kind::Uint32 => "uint32",
        Kind::Sint32 => "sint32",
        Kind::Fixed64 => "fixed64",
        Kind::Sfixed64 => "sfixed64",
        Kind::Fixed32 => "fixed32",
        Kind::Double => "double",
        Kind::Enum(_) => "enum",
    }
}

fn packable(k: Kind) -> bool {
    !matches!(
        k,
        Kind::Message(_) | Kind::String | Kind::Bytes | Kind::Id(_)
    )
}

fn scalar_fits(k: Kind, v: Value<'_>) -> bool {
    matches!(
        (k, v),
        (
            Kind::Bool | Kind::Int64 | Kind::Uint64 | Kind::Uint32 | Kind::Sint32 | Kind::Enum(_),
            Value::Varint(_)
        ) | (
            Kind::Fixed64 | Kind::Sfixed64 | Kind::Double,
            Value::Fixed64(_)
        ) | (Kind::Fixed32, Value::Fixed32(_))
    )
}

/// Calls `each` with every element of a packed repeated scalar.
fn for_each_packed(
    k: Kind,
    b: &[u8],
    mut each: impl FnMut(Value<'_>) -> Result<(), Error>,
) -> Result<(), Error> {
    match k {
        Kind::Fixed64 | Kind::Sfixed64 | Kind::Double => {
            if b.len() % 8 != 0 {
                return Err(Error::malformed("a packed fixed64 run of odd length"));
            }
            for c in b.chunks_exact(8) {
                each(Value::Fixed64(u64::from_le_bytes(c.try_into().unwrap())))?;
            }
        }
        Kind::Fixed32 => {
            if b.len() % 4 != 0 {
                return Err(Error::malformed("a packed fixed32 run of odd length"));
            }
            for c in b.chunks_exact(4) {
                each(Value::Fixed32(u32::from_le_bytes(c.try_into().unwrap())))?;
            }
        }
        _ => {
            // A run of varints: read them as the values of field 1 of a
            // message made of tags and the run's varints.
            let mut pos = 0;
            while pos < b.len() {
                let (v, n) = read_varint(&b[pos..])?;
                each(Value::Varint(v))?;
                pos += n;
            }
        }
    }
    Ok(())
}

fn read_varint(b: &[u8]) -> Result<(u64, usize), Error> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((v, i + 1));
        }
    }
    Err(Error::malformed("a truncated varint in a packed run"))
}

// ---------------------------------------------------------------- to JSON

/// Writes `bytes` (a `msg`, already [`check`]ed or not) as OTLP/JSON.
pub fn to_json(msg: &'static Msg, bytes: &[u8]) -> Result<String, Error> {
    let mut out = String::with_capacity(bytes.len() * 2);
    write_msg(msg, bytes, &mut out, 0)?;
    Ok(out)
}

fn write_msg(msg: &'static Msg, bytes: &[u8], out: &mut String, depth: usize) -> Result<(), Error> {
    if depth > DEPTH_MAX {
        return Err(Error::malformed(format!(
            "{}: nested deeper than {DEPTH_MAX} messages",
            msg.name
        )));
    }
    // Known fields by their place in the schema (repeated fields may be
    // interleaved on the wire; JSON wants each as one array).
    let mut fields: Vec<(usize, Value<'_>)> = Vec::new();
    let mut r = Reader::new(bytes);
    while let Some(field) = r.next_field()? {
        if let Some(i) = msg.fields.iter().position(|d| d.number == field.number) {
            fields.push((i, field.value));
        }
    }
    fields.sort_by_key(|(i, _)| *i);
    out.push('{');
    let mut first = true;
    let mut k = 0;
    while k < fields.len() {
        let i = fields[k].0;
        let def = &msg.fields[i];
        let mut end = k;
        while end < fields.len() && fields[end].0 == i {
            end += 1;
        }
        let group = &fields[k..end];
        k = end;
        if def.repeated {
            let mut items = Vec::new();
            for (_, v) in group {
                match *v {
                    Value::Len(b) if packable(def.kind) => {
                        for_each_packed(def.kind, b, |v| {
                            items.push(scalar_json(msg, def, v)?);
                            Ok(())
                        })?;
                    }
                    v => {
                        let mut s = String::new();
                        if write_value(msg, def, v, &mut s, depth)? {
                            items.push(s);
                        }
                    }
                }
            }
            begin_field(out, &mut first, def);
            out.push('[');
            out.push_str(&items.join(","));
            out.push(']');
        } else {
            // The last occurrence wins, as in protobuf.
            let v = group[group.len() - 1].1;
            let mut s = String::new();
            if write_value(msg, def, v, &mut s, depth)? {
                begin_field(out, &mut first, def);
                out.push_str(&s);
            }
        }
    }
    out.push('}');
    Ok(())
}

fn begin_field(out: &mut String, first: &mut bool, def: &FieldDef) {
    if !*first {
        out.push(',');
    }
    *first = false;
    out.push('"');
    push_camel(out, def.name);
    out.push_str("\":");
}

/// Writes one value; `false` when the field is left out (an empty id).
fn write_value(
    msg: &Msg,
    def: &FieldDef,
    v: Value<'_>,
    out: &mut String,
    depth: usize,
) -> Result<bool, Error> {
    match (def.kind, v) {
        (Kind::Message(m), Value::Len(b)) => write_msg(m, b, out, depth + 1)?,
        (Kind::String, Value::Len(b)) => {
            let s = std::str::from_utf8(b).map_err(|_| {
                Error::malformed(format!("{}.{}: not valid UTF-8", msg.name, def.name))
            })?;
            push_json_str(out, s);
        }
        (Kind::Bytes, Value::Len(b)) => {
            out.push('"');
            out.push_str(&base64::engine::general_purpose::STANDARD.encode(b));
            out.push('"');
        }
        (Kind::Id(_), Value::Len(b)) => {
            if b.is_empty() {
                return Ok(false);
            }
            out.push('"');
            push_hex(out, b);
            out.push('"');
        }
        _ => out.push_str(&scalar_json(msg, def, v)?),
    }
    Ok(true)
}

fn scalar_json(msg: &Msg, def: &FieldDef, v: Value<'_>) -> Result<String, Error> {
    Ok(match (def.kind, v) {
        (Kind::Bool, Value::Varint(x)) => (x != 0).to_string(),
        (Kind::Int64, Value::Varint(x)) => format!("\"{}\"", x as i64),
        (Kind::Uint64, Value::Varint(x)) => format!("\"{x}\""),
        (Kind::Uint32, Value::Varint(x)) => (x as u32).to_string(),
        (Kind::Sint32, Value::Varint(x)) => {
            let x = x as u32;
            (((x >> 1) as i32) ^ -((x & 1) as i32)).to_string()
        }
        (Kind::Enum(_), Value::Varint(x)) => (x as i32).to_string(),
        (Kind::Fixed64, Value::Fixed64(x)) => format!("\"{x}\""),
        (Kind::Sfixed64, Value::Fixed64(x)) => format!("\"{}\"", x as i64),
        (Kind::Double, Value::Fixed64(x)) => double_json(f64::from_bits(x)),
        (Kind::Fixed32, Value::Fixed32(x)) => x.to_string(),
        _ => {
            return Err(Error::malformed(format!(
                "{}.{}: wire type {} does not fit a {}",
                msg.name,
                def.name,
                v.wire_type(),
                kind_name(def.kind)
            )))
        }
    })
}

fn double_json(x: f64) -> String {
    if x.is_nan() {
        "\"NaN\"".into()
    } else if x.is_infinite() {
        if x > 0.0 {
            "\"Infinity\""
        } else {
            "\"-Infinity\""
        }
        .into()
    } else {
        serde_json::to_string(&x).expect("a finite double")
    }
}

fn push_json_str(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).expect("a string serializes"));
}

fn push_hex(out: &mut String, b: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &x in b {
        out.push(HEX[usize::from(x >> 4)] as char);
        out.push(HEX[usize::from(x & 15)] as char);
    }
}

/// Lowercase hex of an id (the Collector's Kafka exporter's trace-id key).
pub fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    push_hex(&mut s, b);
    s
}

// -------------------------------------------------------------- from JSON

/// Reads OTLP/JSON text as `msg` and returns its protobuf encoding.
pub fn from_json(msg: &'static Msg, text: &[u8]) -> Result<Vec<u8>, Error> {
    let v: Json =
        serde_json::from_slice(text).map_err(|e| Error::json(format!("not JSON: {e}")))?;
    if !v.is_object() {
        return Err(Error::json(format!("{}: expected an object", msg.name)));
    }
    let mut out = Vec::with_capacity(text.len() / 2);
    encode_msg(msg, &v, &mut out, 0)?;
    Ok(out)
}

fn encode_msg(msg: &'static Msg, v: &Json, out: &mut Vec<u8>, depth: usize) -> Result<(), Error> {
    if depth > DEPTH_MAX {
        return Err(Error::json(format!(
            "{}: nested deeper than {DEPTH_MAX} objects",
            msg.name
        )));
    }
    let obj = match v {
        Json::Object(o) => o,
        Json::Null => return Ok(()),
        _ => return Err(Error::json(format!("{}: expected an object", msg.name))),
    };
    for (name, value) in obj {
        let Some(def) = msg.by_json_name(name) else {
            continue; // unknown fields are ignored
        };
        if value.is_null() {
            continue;
        }
        if def.repeated {
            let Json::Array(items) = value else {
                return Err(Error::json(format!(
                    "{}.{}: expected an array",
                    msg.name, def.name
                )));
            };
            if packable(def.kind) {
                let mut run = Vec::new();
                for item in items {
                    encode_scalar(msg, def, item, &mut run, false)?;
                }
                if !run.is_empty() {
                    put_len(out, def.number, &run);
                }
            } else {
                for item in items {
                    encode_field(msg, def, item, out, depth)?;
                }
            }
        } else {
            encode_field(msg, def, value, out, depth)?;
        }
    }
    Ok(())
}

fn encode_field(
    msg: &Msg,
    def: &FieldDef,
    v: &Json,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), Error> {
    let bad = |want: &str| Error::json(format!("{}.{}: expected {want}", msg.name, def.name));
    match def.kind {
        Kind::Message(m) => {
            let mut inner = Vec::new();
            encode_msg(m, v, &mut inner, depth + 1)?;
            put_len(out, def.number, &inner);
        }
        Kind::String => put_len(
            out,
            def.number,
            v.as_str().ok_or_else(|| bad("a string"))?.as_bytes(),
        ),
        Kind::Bytes => {
            let s = v.as_str().ok_or_else(|| bad("base64 text"))?;
            let b = decode_base64(s).ok_or_else(|| bad("base64 text"))?;
            put_len(out, def.number, &b);
        }
        Kind::Id(n) => {
            let s = v.as_str().ok_or_else(|| bad("a hex string"))?;
            if s.is_empty() {
                return Ok(());
            }
            let b = decode_hex(s)
                .filter(|b| b.len() == n)
                .ok_or_else(|| bad(&format!("{} hex digits", 2 * n)))?;
            put_len(out, def.number, &b);
        }
        _ => encode_scalar(msg, def, v, out, true)?,
    }
    Ok(())
}

/// Appends one scalar, with its tag when `tagged` (else as an element of
/// a packed run).
fn encode_scalar(
    msg: &Msg,
    def: &FieldDef,
    v: &Json,
    out: &mut Vec<u8>,
    tagged: bool,
) -> Result<(), Error> {
    let bad = |want: &str| Error::json(format!("{}.{}: expected {want}", msg.name, def.name));
    let (wire_type, emit): (u8, Emit) = match def.kind {
        Kind::Bool => (
            wire::VARINT,
            Emit::Varint(u64::from(v.as_bool().ok_or_else(|| bad("true or false"))?)),
        ),
        Kind::Int64 => (
            wire::VARINT,
            Emit::Varint(json_i64(v).ok_or_else(|| bad("an integer"))? as u64),
        ),
        Kind::Uint64 => (
            wire::VARINT,
            Emit::Varint(json_u64(v).ok_or_else(|| bad("an unsigned integer"))?),
        ),
        Kind::Uint32 => {
            let x = json_u64(v)
                .filter(|x| *x <= u64::from(u32::MAX))
                .ok_or_else(|| bad("a 32-bit unsigned integer"))?;
            (wire::VARINT, Emit::Varint(x))
        }
        Kind::Sint32 => {
            let x = json_i64(v)
                .and_then(|x| i32::try_from(x).ok())
                .ok_or_else(|| bad("a 32-bit integer"))?;
            (
                wire::VARINT,
                Emit::Varint(u64::from(((x << 1) ^ (x >> 31)) as u32)),
            )
        }
        Kind::Enum(names) => {
            let x = match v {
                Json::String(s) => names.iter().find(|(n, _)| n == s).map(|(_, x)| *x),
                _ => json_i64(v).and_then(|x| i32::try_from(x).ok()),
            }
            .ok_or_else(|| bad("an enum number or name"))?;
            (wire::VARINT, Emit::Varint(x as i64 as u64))
        }
        Kind::Fixed64 => (
            wire::FIXED64,
            Emit::Fixed64(json_u64(v).ok_or_else(|| bad("an unsigned integer"))?),
        ),
        Kind::Sfixed64 => (
            wire::FIXED64,
            Emit::Fixed64(json_i64(v).ok_or_else(|| bad("an integer"))? as u64),
        ),
        Kind::Double => (
            wire::FIXED64,
            Emit::Fixed64(json_f64(v).ok_or_else(|| bad("a number"))?.to_bits()),
        ),
        Kind::Fixed32 => {
            let x = json_u64(v)
                .filter(|x| *x <= u64::from(u32::MAX))
                .ok_or_else(|| bad("a 32-bit unsigned integer"))?;
            (wire::FIXED32, Emit::Fixed32(x as u32))
        }
        Kind::Message(_) | Kind::String | Kind::Bytes | Kind::Id(_) => {
            unreachable!("not a scalar")
        }
    };
    if tagged {
        put_tag(out, def.number, wire_type);
    }
    match emit {
        Emit::Varint(x) => put_varint(out, x),
        Emit::Fixed64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Emit::Fixed32(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
    Ok(())
}

enum Emit {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
}

fn json_i64(v: &Json) -> Option<i64> {
    match v {
        Json::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= i64::MIN as f64 && *f <= i64::MAX as f64)
                .map(|f| f as i64)
        }),
        Json::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn json_u64(v: &Json) -> Option<u64> {
    match v {
        Json::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        }),
        Json::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn json_f64(v: &Json) -> Option<f64> {
    match v {
        Json::Number(n) => n.as_f64(),
        Json::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            s => s.trim().parse().ok(),
        },
        _ => None,
    }
}

fn decode_base64(s: &str) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|e| e.decode(s).ok())
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}
