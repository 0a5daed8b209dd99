package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"reflect"
	"testing"
)

func f32s(vals ...float32) func(io.Writer) error {
	return func(w io.Writer) error {
		return binary.Write(w, binary.LittleEndian, vals)
	}
}

func TestRoundTrip(t *testing.T) {
	kvs := []KV{
		{"general.architecture", "llama"},
		{"u8", uint8(7)}, {"i8", int8(-7)}, {"u16", uint16(65535)}, {"i16", int16(-2)},
		{"u32", uint32(1 << 31)}, {"i32", int32(-1)}, {"f32", float32(1.5)}, {"bool", true},
		{"u64", uint64(math.MaxUint64)}, {"i64", int64(math.MinInt64)}, {"f64", math.Pi},
		{"tokens", []string{"<unk>", "<s>", "▁hello"}},
		{"scores", []float32{0, -1.5, 2}},
		{"types", []int32{2, 3, 1}},
		{"empty", []uint8{}},
	}
	tensors := []Tensor{
		{Info: TensorInfo{Name: "a", Dims: []uint64{3}, Type: TensorF32}, Data: f32s(1, 2, 3)},
		{Info: TensorInfo{Name: "b", Dims: []uint64{2, 2}, Type: TensorF32}, Data: f32s(4, 5, 6, 7)},
	}
	var buf bytes.Buffer
	if err := Write(&buf, kvs, tensors); err != nil {
		t.Fatal(err)
	}
	f, err := Read(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != Version {
		t.Errorf("version %d, want %d", f.Version, Version)
	}
	if !reflect.DeepEqual(f.KVs, kvs) {
		t.Errorf("KVs differ:\n got %#v\nwant %#v", f.KVs, kvs)
	}
	if len(f.Tensors) != 2 || f.Tensors[0].Offset != 0 || f.Tensors[1].Offset != Alignment {
		t.Fatalf("tensors %+v: want offsets 0 and %d", f.Tensors, Alignment)
	}
	// The data section starts at the first aligned offset after the
	// header; tensor b's third element is 6.
	dataStart := uint64(buf.Len()) - 2*Alignment // a and b, each padded to 32 bytes
	if dataStart%Alignment != 0 {
		t.Fatalf("data section at %d is not aligned", dataStart)
	}
	at := dataStart + f.Tensors[1].Offset + 2*4
	if got := math.Float32frombits(binary.LittleEndian.Uint32(buf.Bytes()[at:])); got != 6 {
		t.Errorf("b[2] = %v, want 6", got)
	}
}

func TestWriteErrors(t *testing.T) {
	tests := []struct {
		name    string
		kvs     []KV
		tensors []Tensor
	}{
		{"unsupported value", []KV{{"x", struct{}{}}}, nil},
		{"bad alignment", []KV{{"general.alignment", uint32(3)}}, nil},
		{"short data", nil, []Tensor{{Info: TensorInfo{Name: "t", Dims: []uint64{4}}, Data: f32s(1)}}},
		{"no dims", nil, []Tensor{{Info: TensorInfo{Name: "t"}, Data: f32s()}}},
		{"not F32", nil, []Tensor{{Info: TensorInfo{Name: "t", Dims: []uint64{1}, Type: 1}, Data: f32s(1)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Write(io.Discard, tt.kvs, tt.tensors); err == nil {
				t.Error("Write succeeded, want an error")
			}
		})
	}
}

func TestReadErrors(t *testing.T) {
	var good bytes.Buffer
	if err := Write(&good, []KV{{"k", "value"}}, nil); err != nil {
		t.Fatal(err)
	}
	huge := append([]byte(nil), good.Bytes()[:24]...)
	huge = binary.LittleEndian.AppendUint64(huge, 1<<40) // key length
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"bad magic", []byte("GGML\x03\x00\x00\x00")},
		{"future version", append([]byte("GGUF"), 9, 0, 0, 0)},
		{"truncated", good.Bytes()[:good.Len()-3]},
		{"huge string", huge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(tt.in))
			if !errors.Is(err, ErrFormat) {
				t.Errorf("err = %v, want ErrFormat", err)
			}
		})
	}
}
