//! Protobuf's wire format, as much of it as OTLP uses: a reader over one
//! message's fields (varint, fixed64, length-delimited, fixed32; groups
//! are refused) and the writers that append tags, varints and
//! length-delimited fields.

use crate::Error;

/// Protobuf wire types.
pub const VARINT: u8 = 0;
/// 8 bytes, little endian.
pub const FIXED64: u8 = 1;
/// A varint length, then that many bytes.
pub const LEN: u8 = 2;
/// 4 bytes, little endian.
pub const FIXED32: u8 = 5;

/// One field's value as it is on the wire.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2.
    Len(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

impl Value<'_> {
    /// The value's wire type.
    pub fn wire_type(&self) -> u8 {
        match self {
            Value::Varint(_) => VARINT,
            Value::Fixed64(_) => FIXED64,
            Value::Len(_) => LEN,
            Value::Fixed32(_) => FIXED32,
        }
    }
}

/// One field: its number, its value, and the bytes it took (tag
/// included), so that a field can be copied as it came.
#[derive(Clone, Copy, Debug)]
pub struct Field<'a> {
    /// The field number.
    pub number: u32,
    /// The value.
    pub value: Value<'a>,
    /// The field's bytes, tag included.
    pub raw: &'a [u8],
}

/// Reads the fields of one message in order.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over one message's bytes.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// The next field, `None` at the end; an error for a truncated field,
    /// a group, a reserved wire type or field number 0.
    pub fn next_field(&mut self) -> Result<Option<Field<'a>>, Error> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let start = self.pos;
        let tag = self.varint()?;
        let number = tag >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Err(Error::malformed(format!("field number {number}")));
        }
        let value = match (tag & 7) as u8 {
            VARINT => Value::Varint(self.varint()?),
            FIXED64 => Value::Fixed64(u64::from_le_bytes(self.take(8)?.try_into().unwrap())),
            LEN => {
                let len = self.varint()?;
                let len =
                    usize::try_from(len).map_err(|_| Error::malformed(format!("length {len}")))?;
                Value::Len(self.take(len)?)
            }
            FIXED32 => Value::Fixed32(u32::from_le_bytes(self.take(4)?.try_into().unwrap())),
            t => {
                return Err(Error::malformed(format!(
                    "wire type {t} of field {number} (groups are not used by OTLP)"
                )))
            }
        };
        Ok(Some(Field {
            number: number as u32,
            value,
            raw: &self.buf[start..self.pos],
        }))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.buf.len() - self.pos < n {
            return Err(Error::malformed("a field runs past the end of its message"));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn varint(&mut self) -> Result<u64, Error> {
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(Error::malformed(
                    "a varint runs past the end of its message",
                ));
            };
            self.pos += 1;
            if i == 9 && b > 1 {
                return Err(Error::malformed("a varint longer than 64 bits"));
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Error::malformed("a varint longer than 10 bytes"))
    }
}

/// Appends a varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a field's tag.
pub fn put_tag(out: &mut Vec<u8>, number: u32, wire_type: u8) {
    put_varint(out, (u64::from(number) << 3) | u64::from(wire_type));
}

/// Appends a length-delimited field.
pub fn put_len(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_tag(out, number, LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends a varint field.
pub fn put_varint_field(out: &mut Vec<u8>, number: u32, v: u64) {
    put_tag(out, number, VARINT);
    put_varint(out, v);
}

/// Appends a length-delimited field whose body `body` writes (the length
/// is patched in afterwards).
pub fn put_nested(out: &mut Vec<u8>, number: u32, body: impl FnOnce(&mut Vec<u8>)) {
    put_tag(out, number, LEN);
    let mut inner = Vec::new();
    body(&mut inner);
    put_varint(out, inner.len() as u64);
    out.extend_from_slice(&inner);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_as_written() {
        let mut b = Vec::new();
        put_varint_field(&mut b, 1, 300);
        put_len(&mut b, 2, b"abc");
        put_tag(&mut b, 3, FIXED64);
        b.extend_from_slice(&7u64.to_le_bytes());
        put_tag(&mut b, 4, FIXED32);
        b.extend_from_slice(&9u32.to_le_bytes());
        let mut r = Reader::new(&b);
        let f = r.next_field().unwrap().unwrap();
        assert_eq!((f.number, f.value), (1, Value::Varint(300)));
        assert_eq!(f.raw, &[8, 0xac, 2]);
        assert_eq!(r.next_field().unwrap().unwrap().value, Value::Len(b"abc"));
        assert_eq!(r.next_field().unwrap().unwrap().value, Value::Fixed64(7));
        assert_eq!(r.next_field().unwrap().unwrap().value, Value::Fixed32(9));
        assert!(r.next_field().unwrap().is_none());
    }

    #[test]
    fn truncated_and_hostile_fields_are_refused() {
        for bad in [
            &[0x0a, 5, 1, 2][..], // length past the end
            &[0x08][..],          // varint missing
            &[0x0b][..],          // group start
            &[0x00, 1][..],       // field 0
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
            ][..],
            &[0x09, 1, 2][..], // fixed64 short
        ] {
            let mut r = Reader::new(bad);
            assert!(r.next_field().is_err(), "{bad:?}");
        }
    }
}
