package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// Tensor is a tensor to write: its description (Type must be TensorF32;
// Offset is ignored) and a function that writes its data, exactly
// Elements() × 4 bytes, little-endian.
type Tensor struct {
	Info TensorInfo
	Data func(w io.Writer) error
}

// Write writes a version-3 GGUF file with the given metadata and tensors.
// Tensor data is aligned to general.alignment when kvs sets it (as a
// uint32), else to Alignment.
func Write(w io.Writer, kvs []KV, tensors []Tensor) error {
	align := uint64(Alignment)
	for _, kv := range kvs {
		if kv.Key == "general.alignment" {
			a, ok := kv.Value.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 {
				return fmt.Errorf("gguf: general.alignment must be a power of two uint32, got %v", kv.Value)
			}
			align = uint64(a)
		}
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	e := &encoder{w: bw}
	e.bytes([]byte(Magic))
	e.u32(Version)
	e.u64(uint64(len(tensors)))
	e.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		e.str(kv.Key)
		if err := e.value(kv.Value); err != nil {
			return fmt.Errorf("gguf: key %s: %w", kv.Key, err)
		}
	}
	var offset uint64
	for _, t := range tensors {
		if t.Info.Type != TensorF32 {
			return fmt.Errorf("gguf: tensor %s: only F32 tensors can be written", t.Info.Name)
		}
		if len(t.Info.Dims) == 0 || len(t.Info.Dims) > maxDims {
			return fmt.Errorf("gguf: tensor %s has %d dimensions", t.Info.Name, len(t.Info.Dims))
		}
		e.str(t.Info.Name)
		e.u32(uint32(len(t.Info.Dims)))
		for _, d := range t.Info.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Info.Type))
		e.u64(offset)
		offset += pad(t.Info.Elements()*4, align)
	}
	if len(tensors) > 0 { // llama.cpp pads the header only when data follows
		e.zeros(pad(e.n, align) - e.n)
	}
	for _, t := range tensors {
		size := t.Info.Elements() * 4
		start := e.n
		if e.err == nil {
			e.err = t.Data(e)
		}
		if e.err == nil && e.n-start != size {
			return fmt.Errorf("gguf: tensor %s: wrote %d bytes of data, want %d", t.Info.Name, e.n-start, size)
		}
		e.zeros(pad(size, align) - size)
	}
	if e.err != nil {
		return fmt.Errorf("gguf: %w", e.err)
	}
	return bw.Flush()
}

func pad(n, align uint64) uint64 { return (n + align - 1) / align * align }

// encoder writes little-endian values, counts bytes and keeps the first
// error. It is also the io.Writer tensor data goes through, so that the
// count covers it.
type encoder struct {
	w   io.Writer
	n   uint64
	err error
	buf [8]byte
}

func (e *encoder) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.n += uint64(n)
	e.err = err
	return n, err
}

func (e *encoder) bytes(p []byte) { _, _ = e.Write(p) }
func (e *encoder) u8(v uint8)     { e.bytes([]byte{v}) }
func (e *encoder) u16(v uint16)   { e.bytes(binary.LittleEndian.AppendUint16(e.buf[:0], v)) }
func (e *encoder) u32(v uint32)   { e.bytes(binary.LittleEndian.AppendUint32(e.buf[:0], v)) }
func (e *encoder) u64(v uint64)   { e.bytes(binary.LittleEndian.AppendUint64(e.buf[:0], v)) }
func (e *encoder) str(s string)   { e.u64(uint64(len(s))); e.bytes([]byte(s)) }

func (e *encoder) zeros(n uint64) {
	var z [Alignment]byte
	for n > 0 {
		k := min(n, uint64(len(z)))
		e.bytes(z[:k])
		n -= k
	}
}

// value writes v's type tag and v.
func (e *encoder) value(v any) error {
	t, ok := typeOf(v)
	if !ok {
		return fmt.Errorf("unsupported value of type %T", v)
	}
	e.u32(uint32(t))
	if t != TypeArray {
		e.scalar(v)
		return nil
	}
	switch a := v.(type) {
	case []uint8:
		writeArray(e, a)
	case []int8:
		writeArray(e, a)
	case []uint16:
		writeArray(e, a)
	case []int16:
		writeArray(e, a)
	case []uint32:
		writeArray(e, a)
	case []int32:
		writeArray(e, a)
	case []float32:
		writeArray(e, a)
	case []bool:
		writeArray(e, a)
	case []string:
		writeArray(e, a)
	case []uint64:
		writeArray(e, a)
	case []int64:
		writeArray(e, a)
	case []float64:
		writeArray(e, a)
	}
	return nil
}

func writeArray[T any](e *encoder, a []T) {
	var zero T
	t, _ := typeOf(zero)
	e.u32(uint32(t))
	e.u64(uint64(len(a)))
	for _, v := range a {
		e.scalar(v)
	}
}

func (e *encoder) scalar(v any) {
	switch x := v.(type) {
	case uint8:
		e.u8(x)
	case int8:
		e.u8(uint8(x))
	case uint16:
		e.u16(x)
	case int16:
		e.u16(uint16(x))
	case uint32:
		e.u32(x)
	case int32:
		e.u32(uint32(x))
	case float32:
		e.u32(math.Float32bits(x))
	case bool:
		if x {
			e.u8(1)
		} else {
			e.u8(0)
		}
	case string:
		e.str(x)
	case uint64:
		e.u64(x)
	case int64:
		e.u64(uint64(x))
	case float64:
		e.u64(math.Float64bits(x))
	}
}

// typeOf maps a Go value to its GGUF type tag.
func typeOf(v any) (ValueType, bool) {
	switch v.(type) {
	case uint8:
		return TypeUint8, true
	case int8:
		return TypeInt8, true
	case uint16:
		return TypeUint16, true
	case int16:
		return TypeInt16, true
	case uint32:
		return TypeUint32, true
	case int32:
		return TypeInt32, true
	case float32:
		return TypeFloat32, true
	case bool:
		return TypeBool, true
	case string:
		return TypeString, true
	case uint64:
		return TypeUint64, true
	case int64:
		return TypeInt64, true
	case float64:
		return TypeFloat64, true
	case []uint8, []int8, []uint16, []int16, []uint32, []int32, []float32, []bool, []string, []uint64, []int64, []float64:
		return TypeArray, true
	}
	return 0, false
}
