package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"
)

// The fixtures are written byte by byte from the msgpack spec and vLLM's
// declarations (vllm/distributed/kv_events.py): msgspec Structs with
// omit_defaults, the events tagged with their class name; array_like in
// most releases (the subscriber example's copy), maps in the current source.

// fixstr is a msgpack fixstr (up to 31 bytes): 0xa0|len, then the bytes.
func fixstr(s string) []byte { return append([]byte{0xa0 | byte(len(s))}, s...) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func b(x ...byte) []byte { return x }

func hexb(s string) []byte {
	out, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return out
}

// arrayFixture: [1.5, [stored, removed, cleared]] as the subscriber
// example's array_like structs lay it out.
var arrayFixture = cat(
	b(0x92),                        // the batch: fixarray of 2 (no data_parallel_rank)
	hexb("cb3ff8000000000000"),     // ts: float64 1.5
	b(0x93),                        // events: fixarray of 3
	b(0x97), fixstr("BlockStored"), // tag + 6 fields
	b(0x92, 0x01), hexb("cfffffffffffffffff"), // block_hashes [1, 2**64-1]
	b(0xc0),                                                                           // parent_block_hash None
	b(0x96, 0x01, 0x02, 0x03), hexb("cd012c"), hexb("ce00011170"), hexb("ce0001f400"), // token_ids [1 2 3 300 70000 128000]
	b(0x03),       // block_size 3
	b(0xc0),       // lora_id None
	fixstr("GPU"), // medium
	b(0x93), fixstr("BlockRemoved"),
	b(0x91, 0xff), // block_hashes [-1]: Python's builtin hash can be negative
	fixstr("CPU"),
	b(0x91), fixstr("AllBlocksCleared"),
)

var arrayWant = Batch{TS: 1.5, Events: []Event{
	{Kind: BlockStored, Hashes: []uint64{1, 1<<64 - 1}, Tokens: []int32{1, 2, 3, 300, 70000, 128000}, BlockSize: 3, Medium: MediumGPU},
	{Kind: BlockRemoved, Hashes: []uint64{1<<64 - 1}, Medium: MediumCPU},
	{Kind: AllBlocksCleared, Medium: MediumGPU},
}}

// sha is a 32-byte sha256-like block hash whose last eight bytes are 0..7.
var sha = hexb("ffeeddccbbaa99887766554433221100aabbccddeeff00110001020304050607")

// mapFixture: the current layout, hashes as bytes (vLLM's default), with
// fields this package does not know (extra_keys, kv_cache_spec_kind) and
// an old event without medium.
var mapFixture = cat(
	b(0x83),
	fixstr("ts"), hexb("cb4000000000000000"), // 2.0
	fixstr("events"), b(0x92),
	b(0x8a), fixstr("type"), fixstr("BlockStored"),
	fixstr("block_hashes"), b(0x91, 0xc4, 0x20), sha, // bin8 of 32 bytes
	fixstr("parent_block_hash"), b(0xc4, 0x03, 0x01, 0x02, 0x03), // a short bin
	fixstr("token_ids"), b(0x92, 0x05, 0x06),
	fixstr("block_size"), b(0x02),
	fixstr("lora_id"), b(0x07),
	fixstr("medium"), fixstr("CPU"),
	fixstr("lora_name"), fixstr("sql"),
	fixstr("extra_keys"), b(0x91, 0x91, 0xa1, 'x'), // [["x"]]
	fixstr("kv_cache_spec_kind"), fixstr("full"),
	b(0x82), fixstr("type"), fixstr("BlockRemoved"),
	fixstr("block_hashes"), b(0x91, 0xcc, 0xc8), // [200] as uint8
	fixstr("data_parallel_rank"), b(0x01),
)

var mapWant = Batch{TS: 2, DPRank: 1, HasDPRank: true, Events: []Event{
	{Kind: BlockStored, Hashes: []uint64{0x0001020304050607}, Parent: 0x010203, HasParent: true,
		Tokens: []int32{5, 6}, BlockSize: 2, LoRAID: 7, LoRAName: "sql", Medium: MediumCPU},
	{Kind: BlockRemoved, Hashes: []uint64{200}, Medium: MediumGPU},
}}

// sglangFixture: SGLang's declarations (sglang/srt/disaggregation/
// kv_events.py): array_like, BlockStored without medium, BlockRemoved with
// its hashes only, hashes signed int64 (hash_str_to_int64), one page per
// event, the batch's third field attn_dp_rank; the second page's token ids
// as EAGLE bigram pairs.
var sglangFixture = cat(
	b(0x93), hexb("cb4008000000000000"), // 3.0
	b(0x93),
	b(0x96), fixstr("BlockStored"), b(0x91, 0xfb), b(0xc0), b(0x92, 0x01, 0x02), b(0x02), b(0xc0), // [-5], no parent, [1 2]
	b(0x96), fixstr("BlockStored"), b(0x91), hexb("d38000000000000000"), b(0xfb), // [-2**63], parent -5
	b(0x92, 0x92, 0x03, 0x04, 0x92, 0x04, 0x05), b(0x02), b(0xc0), // [(3,4) (4,5)]
	b(0x92), fixstr("BlockRemoved"), b(0x91, 0xfb),
	b(0x00), // attn_dp_rank 0
)

var sglangWant = Batch{TS: 3, HasDPRank: true, Events: []Event{
	{Kind: BlockStored, Hashes: []uint64{1<<64 - 5}, Tokens: []int32{1, 2}, BlockSize: 2, Medium: MediumGPU},
	{Kind: BlockStored, Hashes: []uint64{1 << 63}, Parent: 1<<64 - 5, HasParent: true, Tokens: []int32{3, 4}, BlockSize: 2, Medium: MediumGPU},
	{Kind: BlockRemoved, Hashes: []uint64{1<<64 - 5}, Medium: MediumGPU},
}}

func TestDecode(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		want    Batch
		wantErr bool
	}{
		{name: "array_like", in: arrayFixture, want: arrayWant},
		{name: "map", in: mapFixture, want: mapWant},
		{name: "sglang", in: sglangFixture, want: sglangWant},
		{name: "empty", in: nil, wantErr: true},
		{name: "truncated", in: arrayFixture[:20], wantErr: true},
		{name: "not a struct", in: b(0x05), wantErr: true},
		{name: "unknown event", in: cat(b(0x92, 0x00, 0x91, 0x91), fixstr("BlockMoved")), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrFormat) {
					t.Fatalf("Decode = %+v, %v; want ErrFormat", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Decode =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

// TestEncodeArrayBytes checks the encoder against bytes written by hand:
// the layout vLLM's msgspec writes for the current fields (lora_name after
// medium) when array_like.
func TestEncodeArrayBytes(t *testing.T) {
	in := Batch{TS: 1.5, DPRank: 0, HasDPRank: true, Events: []Event{
		{Kind: BlockStored, Hashes: []uint64{300}, Parent: 5, HasParent: true, Tokens: []int32{9, -1}, BlockSize: 2, Medium: MediumGPU},
		{Kind: BlockRemoved, Hashes: []uint64{5}, Medium: MediumGPU},
		{Kind: AllBlocksCleared},
	}}
	want := cat(
		b(0x93), hexb("cb3ff8000000000000"), b(0x93),
		b(0x98), fixstr("BlockStored"), b(0x91), hexb("cd012c"), b(0x05), b(0x92, 0x09, 0xff), b(0x02), b(0xc0), fixstr("GPU"), b(0xc0),
		b(0x93), fixstr("BlockRemoved"), b(0x91, 0x05), fixstr("GPU"),
		b(0x91), fixstr("AllBlocksCleared"),
		b(0x00), // data_parallel_rank 0
	)
	got := Encode(nil, in, FormatArray)
	if !bytes.Equal(got, want) {
		t.Fatalf("Encode =\n%x\nwant\n%x", got, want)
	}
}

// TestEncodeSGLangBytes: SGLang's layout, written by hand (the fixture
// without its bigram page).
func TestEncodeSGLangBytes(t *testing.T) {
	in := sglangWant
	in.Events = []Event{in.Events[0], in.Events[2]}
	want := cat(
		b(0x93), hexb("cb4008000000000000"), b(0x92),
		b(0x96), fixstr("BlockStored"), b(0x91, 0xfb), b(0xc0), b(0x92, 0x01, 0x02), b(0x02), b(0xc0),
		b(0x92), fixstr("BlockRemoved"), b(0x91, 0xfb),
		b(0x00),
	)
	if got := Encode(nil, in, FormatSGLang); !bytes.Equal(got, want) {
		t.Fatalf("Encode =\n%x\nwant\n%x", got, want)
	}
}

func TestRoundTrip(t *testing.T) {
	in := Batch{TS: 1234.5, DPRank: 2, HasDPRank: true, Events: []Event{
		{Kind: BlockStored, Hashes: []uint64{1 << 63, 42}, Tokens: []int32{1, 2, 3, 4}, BlockSize: 2, LoRAID: 3, LoRAName: "a", Medium: MediumGPU},
		{Kind: BlockRemoved, Hashes: []uint64{42}, Medium: MediumCPU},
		{Kind: AllBlocksCleared, Medium: MediumGPU},
	}}
	for _, f := range []Format{FormatMap, FormatArray} {
		got, err := Decode(Encode(nil, in, f))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, in) {
			t.Fatalf("format %d: round trip =\n%+v\nwant\n%+v", f, got, in)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(arrayFixture)
	f.Add(mapFixture)
	f.Add(sglangFixture)
	f.Fuzz(func(t *testing.T, in []byte) {
		_, _ = Decode(in) // must not panic or hang
	})
}
