package gguf

import (
	"bufio"
	"encoding/binary"
	"io"
	"math"
)

// Limits that keep a corrupt or hostile file from making Read allocate
// without bound; real files are far below them (a 256k-token vocabulary is
// one array of 262,144 strings).
const (
	maxString  = 64 << 20
	maxArray   = 1 << 24
	maxEntries = 1 << 20
	maxDims    = 4 // GGML_MAX_DIMS
)

// Read parses a GGUF file's header, metadata and tensor descriptions from r,
// leaving the tensor data unread.
func Read(r io.Reader) (*File, error) {
	d := &decoder{r: bufio.NewReader(r)}
	var magic [4]byte
	if _, err := io.ReadFull(d.r, magic[:]); err != nil {
		return nil, formatErr("reading magic: %v", err)
	}
	if string(magic[:]) != Magic {
		return nil, formatErr("magic %q, want %q", magic[:], Magic)
	}
	f := &File{Version: d.u32()}
	if d.err == nil && (f.Version < 2 || f.Version > Version) {
		return nil, formatErr("unsupported version %d", f.Version)
	}
	nTensors, nKV := d.u64(), d.u64()
	if d.err == nil && (nTensors > maxEntries || nKV > maxEntries) {
		return nil, formatErr("%d tensors and %d keys is implausible", nTensors, nKV)
	}
	for i := uint64(0); i < nKV && d.err == nil; i++ {
		key := d.str()
		v := d.value(ValueType(d.u32()), true)
		f.KVs = append(f.KVs, KV{Key: key, Value: v})
	}
	for i := uint64(0); i < nTensors && d.err == nil; i++ {
		t := TensorInfo{Name: d.str()}
		n := d.u32()
		if n > maxDims {
			return nil, formatErr("tensor %q has %d dimensions", t.Name, n)
		}
		for range n {
			t.Dims = append(t.Dims, d.u64())
		}
		t.Type = TensorType(d.u32())
		t.Offset = d.u64()
		f.Tensors = append(f.Tensors, t)
	}
	if d.err != nil {
		return nil, formatErr("%v", d.err)
	}
	return f, nil
}

// decoder reads little-endian values and keeps the first error, so that a
// sequence of reads needs one check at the end.
type decoder struct {
	r   *bufio.Reader
	err error
	buf [8]byte
}

func (d *decoder) fill(n int) []byte {
	if d.err != nil {
		return d.buf[:n] // zeros: harmless, and the error is reported
	}
	if _, err := io.ReadFull(d.r, d.buf[:n]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		d.err = err
		clear(d.buf[:])
	}
	return d.buf[:n]
}

func (d *decoder) u8() uint8   { return d.fill(1)[0] }
func (d *decoder) u16() uint16 { return binary.LittleEndian.Uint16(d.fill(2)) }
func (d *decoder) u32() uint32 { return binary.LittleEndian.Uint32(d.fill(4)) }
func (d *decoder) u64() uint64 { return binary.LittleEndian.Uint64(d.fill(8)) }

func (d *decoder) str() string {
	n := d.u64()
	if d.err != nil {
		return ""
	}
	if n > maxString {
		d.err = formatErr("string of %d bytes", n)
		return ""
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(d.r, b); err != nil {
		d.err = io.ErrUnexpectedEOF
		return ""
	}
	return string(b)
}

// value reads one value of type t; arrays only when allowArray (the format
// allows nesting, but no file llama.cpp reads nests, and we don't write it).
func (d *decoder) value(t ValueType, allowArray bool) any {
	switch t {
	case TypeUint8:
		return d.u8()
	case TypeInt8:
		return int8(d.u8())
	case TypeUint16:
		return d.u16()
	case TypeInt16:
		return int16(d.u16())
	case TypeUint32:
		return d.u32()
	case TypeInt32:
		return int32(d.u32())
	case TypeFloat32:
		return math.Float32frombits(d.u32())
	case TypeBool:
		return d.u8() != 0
	case TypeString:
		return d.str()
	case TypeUint64:
		return d.u64()
	case TypeInt64:
		return int64(d.u64())
	case TypeFloat64:
		return math.Float64frombits(d.u64())
	case TypeArray:
		if allowArray {
			return d.array()
		}
	}
	if d.err == nil {
		d.err = formatErr("unsupported value type %d", t)
	}
	return nil
}

func (d *decoder) array() any {
	elem := ValueType(d.u32())
	n := d.u64()
	if d.err != nil {
		return nil
	}
	if n > maxArray {
		d.err = formatErr("array of %d elements", n)
		return nil
	}
	switch elem {
	case TypeUint8:
		return readSlice(d, n, elem, func(v any) uint8 { return v.(uint8) })
	case TypeInt8:
		return readSlice(d, n, elem, func(v any) int8 { return v.(int8) })
	case TypeUint16:
		return readSlice(d, n, elem, func(v any) uint16 { return v.(uint16) })
	case TypeInt16:
		return readSlice(d, n, elem, func(v any) int16 { return v.(int16) })
	case TypeUint32:
		return readSlice(d, n, elem, func(v any) uint32 { return v.(uint32) })
	case TypeInt32:
		return readSlice(d, n, elem, func(v any) int32 { return v.(int32) })
	case TypeFloat32:
		return readSlice(d, n, elem, func(v any) float32 { return v.(float32) })
	case TypeBool:
		return readSlice(d, n, elem, func(v any) bool { return v.(bool) })
	case TypeString:
		return readSlice(d, n, elem, func(v any) string { return v.(string) })
	case TypeUint64:
		return readSlice(d, n, elem, func(v any) uint64 { return v.(uint64) })
	case TypeInt64:
		return readSlice(d, n, elem, func(v any) int64 { return v.(int64) })
	case TypeFloat64:
		return readSlice(d, n, elem, func(v any) float64 { return v.(float64) })
	}
	d.err = formatErr("unsupported array element type %d", elem)
	return nil
}

func readSlice[T any](d *decoder, n uint64, elem ValueType, conv func(any) T) []T {
	out := make([]T, 0, min(n, 1<<16)) // grow as data arrives, not as the header claims
	for i := uint64(0); i < n && d.err == nil; i++ {
		v := d.value(elem, false)
		if d.err != nil {
			return nil
		}
		out = append(out, conv(v))
	}
	return out
}
