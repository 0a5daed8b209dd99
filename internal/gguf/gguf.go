// Package gguf reads and writes GGUF, the file format llama.cpp loads models
// from: a header, typed key-value metadata, tensor descriptions, then the
// tensor data, all little-endian. kvroute needs it to make a model with
// random weights for a real llama-server: no package ships trained weights,
// but llama.cpp's source ships vocabulary-only GGUF files whose metadata can
// be reused.
//
// Only what that needs is supported: reading the metadata and tensor
// descriptions (not the data), and writing F32 tensors.
package gguf

import (
	"errors"
	"fmt"
)

// Magic opens every GGUF file.
const Magic = "GGUF"

// Version is the format version written. Read also accepts version 2,
// which lays out a little-endian file the same way (version 1 had 32-bit
// counts and is not read).
const Version = 3

// Alignment is the default alignment of tensor data, in bytes, used when a
// file has no general.alignment.
const Alignment = 32

// ValueType is a metadata value's type tag in the file.
type ValueType uint32

// The metadata value types, numbered as in the format.
const (
	TypeUint8 ValueType = iota
	TypeInt8
	TypeUint16
	TypeInt16
	TypeUint32
	TypeInt32
	TypeFloat32
	TypeBool
	TypeString
	TypeArray
	TypeUint64
	TypeInt64
	TypeFloat64
)

// TensorType is a tensor's element type (ggml's type numbers).
type TensorType uint32

// The tensor types this package writes.
const (
	TensorF32 TensorType = 0
)

// KV is one metadata entry. Value holds a Go value of the matching type:
// uint8, int8, uint16, int16, uint32, int32, float32, bool, string, uint64,
// int64, float64, or a slice of one of those for an array (nested arrays
// are not supported).
type KV struct {
	Key   string
	Value any
}

// TensorInfo describes one tensor. Dims are in ggml's order: Dims[0] is the
// innermost (contiguous) dimension.
type TensorInfo struct {
	Name string
	Dims []uint64
	Type TensorType
	// Offset is the data's offset from the start of the data section, in
	// bytes (set by Read; Write computes its own).
	Offset uint64
}

// Elements is the tensor's number of elements.
func (t TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// File is a GGUF file's metadata and tensor descriptions.
type File struct {
	Version uint32
	KVs     []KV
	Tensors []TensorInfo
}

// Get returns the value of key, and whether it is present.
func (f *File) Get(key string) (any, bool) {
	for _, kv := range f.KVs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// ErrFormat means the input is not a well-formed GGUF file.
var ErrFormat = errors.New("gguf: malformed file")

func formatErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFormat, fmt.Sprintf(format, args...))
}
