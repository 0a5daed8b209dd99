package kvevents

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ErrFormat means a payload is not a KV event batch.
var ErrFormat = errors.New("kvevents: not a KV event batch")

// Format is how a batch's structs are laid out in msgpack. vLLM declares
// them as msgspec Structs with omit_defaults and a tag on the events: for
// most of its releases also array_like (FormatArray, what its subscriber
// example decodes), in its current source without it, as maps
// (FormatMap). SGLang keeps its own copy of the declarations, array_like
// with fewer fields (FormatSGLang). Decode reads all three; llm-d's
// simulator sends either of vLLM's.
type Format uint8

const (
	// FormatMap: a batch is {"ts", "events", "data_parallel_rank"}, an
	// event {"type": tag, field: value, ...}.
	FormatMap Format = iota
	// FormatArray: a batch is [ts, events, data_parallel_rank?], an event
	// [tag, fields in declaration order...].
	FormatArray
	// FormatSGLang: as SGLang's kv_events.py declares them, array_like: a
	// batch is [ts, events, attn_dp_rank], BlockStored [tag, block_hashes,
	// parent_block_hash, token_ids, block_size, lora_id], BlockRemoved
	// [tag, block_hashes]; hashes are signed int64s (the first eight bytes
	// of its chained SHA-256), one page per event.
	FormatSGLang
)

// ParseFormat reads a Format's name: "map" or "array".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "map", "":
		return FormatMap, nil
	case "array":
		return FormatArray, nil
	case "sglang":
		return FormatSGLang, nil
	}
	return 0, fmt.Errorf("kvevents: unknown format %q (map, array or sglang)", s)
}

// The events' fields in vLLM's declaration order: an array-encoded event
// lists them so after its tag, the trailing defaults omitted.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

// decoder bounds every length it reads by the bytes left, so that a
// corrupt length cannot make it allocate gigabytes.
type decoder struct {
	*msgpack.Decoder
	r   *bytes.Reader
	buf []byte // what r reads
}

// str reads a string or bytes after checking that its declared length
// fits in what is left: the decoder would allocate it first.
func (d *decoder) str() ([]byte, error) {
	left := d.buf[len(d.buf)-d.r.Len():]
	if len(left) == 0 {
		return nil, io.ErrUnexpectedEOF
	}
	var n uint64
	switch c := left[0]; {
	case (c == msgpcode.Str8 || c == msgpcode.Bin8) && len(left) >= 2:
		n = uint64(left[1])
	case (c == msgpcode.Str16 || c == msgpcode.Bin16) && len(left) >= 3:
		n = uint64(binary.BigEndian.Uint16(left[1:]))
	case (c == msgpcode.Str32 || c == msgpcode.Bin32) && len(left) >= 5:
		n = uint64(binary.BigEndian.Uint32(left[1:]))
	}
	if n > uint64(len(left)) {
		return nil, fmt.Errorf("a string of %d bytes with %d left", n, len(left))
	}
	return d.DecodeBytes()
}

func (d *decoder) string() (string, error) {
	b, err := d.str()
	return string(b), err
}

func (d *decoder) arrayLen() (int, error) {
	n, err := d.DecodeArrayLen()
	if err == nil && n > d.r.Len() {
		err = fmt.Errorf("an array of %d with %d bytes left", n, d.r.Len())
	}
	return n, err
}

func (d *decoder) mapLen() (int, error) {
	n, err := d.DecodeMapLen()
	if err == nil && n > d.r.Len() {
		err = fmt.Errorf("a map of %d with %d bytes left", n, d.r.Len())
	}
	return n, err
}

// Decode reads one batch, in either format. Fields it does not know are
// skipped, so a newer engine's additions do not break it.
func Decode(payload []byte) (Batch, error) {
	r := bytes.NewReader(payload)
	d := &decoder{Decoder: msgpack.NewDecoder(r), r: r, buf: payload}
	var b Batch
	batchFields := []string{"ts", "events", "data_parallel_rank"}
	err := eachField(d, &batchFields, false, func(name string) error {
		switch name {
		case "ts":
			return decodeFloat(d, &b.TS)
		case "events":
			return decodeEvents(d, &b.Events)
		case "data_parallel_rank":
			n, ok, err := decodeOptInt(d)
			b.DPRank, b.HasDPRank = n, ok
			return err
		}
		return d.Skip()
	})
	if err != nil {
		return Batch{}, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	return b, nil
}

// eachField calls f with the name of each field of the struct at d's
// position, an array (fields named by position in *names, read as each
// comes: the tag may choose them) or a map (named by their keys). When
// tagged, an array's first element and a map's "type" are the tag, which f
// receives as tagField. f decodes or skips the field's value.
func eachField(d *decoder, names *[]string, tagged bool, f func(name string) error) error {
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.arrayLen()
		if err != nil {
			return err
		}
		for i := range n {
			name, j := "", i
			if tagged {
				j--
			}
			switch {
			case j < 0:
				name = tagField
			case j < len(*names):
				name = (*names)[j]
			}
			if err := f(name); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.mapLen()
		if err != nil {
			return err
		}
		for range n {
			key, err := d.string()
			if err != nil {
				return err
			}
			if tagged && key == "type" {
				key = tagField
			}
			if err := f(key); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("a struct is an array or a map, not code %#x", c)
}

func decodeEvents(d *decoder, dst *[]Event) error {
	n, err := d.arrayLen()
	if err != nil {
		return err
	}
	*dst = make([]Event, 0, max(n, 0))
	for range n {
		e, err := decodeEvent(d)
		if err != nil {
			return err
		}
		*dst = append(*dst, e)
	}
	return nil
}

// tagField is the name eachField gives an event's tag.
const tagField = "\x00tag"

func decodeEvent(d *decoder) (Event, error) {
	var e Event
	names := storedFields
	err := eachField(d, &names, true, func(name string) error {
		if name == tagField {
			tag, err := d.string()
			if err != nil {
				return err
			}
			for k, t := range tags {
				if t == tag && t != "" {
					e.Kind = Kind(k)
				}
			}
			if e.Kind == BlockRemoved {
				names = removedFields
			}
			return nil
		}
		return decodeEventField(d, &e, name)
	})
	if err != nil {
		return Event{}, err
	}
	if e.Kind == 0 {
		return Event{}, errors.New("an event of unknown type")
	}
	if e.Medium == "" {
		e.Medium = MediumGPU
	}
	return e, nil
}

func decodeEventField(d *decoder, e *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		e.Hashes, err = decodeHashes(d)
	case "parent_block_hash":
		e.Parent, e.HasParent, err = decodeOptHash(d)
	case "token_ids":
		e.Tokens, err = decodeTokens(d)
	case "block_size":
		e.BlockSize, _, err = decodeOptInt(d)
	case "lora_id":
		e.LoRAID, _, err = decodeOptInt(d)
	case "lora_name":
		e.LoRAName, err = decodeOptString(d)
	case "medium":
		e.Medium, err = decodeOptString(d)
	case "group_idx":
		e.Group, _, err = decodeOptInt(d)
	default:
		err = d.Skip()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func isNil(d *decoder) (bool, error) {
	c, err := d.PeekCode()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, d.DecodeNil()
	}
	return false, nil
}

func decodeFloat(d *decoder, dst *float64) error {
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	if c == msgpcode.Float || c == msgpcode.Double {
		*dst, err = d.DecodeFloat64()
		return err
	}
	n, err := d.DecodeInt64() // msgspec writes a float; accept an int
	*dst = float64(n)
	return err
}

func decodeOptInt(d *decoder) (int, bool, error) {
	if null, err := isNil(d); null || err != nil {
		return 0, false, err
	}
	n, err := d.DecodeInt64()
	return int(n), err == nil, err
}

func decodeOptString(d *decoder) (string, error) {
	if null, err := isNil(d); null || err != nil {
		return "", err
	}
	return d.string()
}

// decodeOptHash reads a block hash: an int (a negative one, Python's
// builtin hash, as its two's complement), or bytes, of which the last
// eight, big-endian, are what vLLM sends as an int
// (int.from_bytes(hash, "big") & (2**64 - 1)).
func decodeOptHash(d *decoder) (uint64, bool, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c == msgpcode.Nil:
		return 0, false, d.DecodeNil()
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		b, err := d.str()
		if err != nil {
			return 0, false, err
		}
		var last [8]byte
		copy(last[max(0, 8-len(b)):], b[max(0, len(b)-8):])
		return binary.BigEndian.Uint64(last[:]), true, nil
	}
	h, err := d.DecodeUint64()
	return h, err == nil, err
}

func decodeHashes(d *decoder) ([]uint64, error) {
	n, err := d.arrayLen()
	if err != nil || n <= 0 {
		return nil, err
	}
	hs := make([]uint64, n)
	for i := range hs {
		h, ok, err := decodeOptHash(d)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, errors.New("a null block hash")
		}
		hs[i] = h
	}
	return hs, nil
}

func decodeTokens(d *decoder) ([]int32, error) {
	n, err := d.arrayLen()
	if err != nil || n <= 0 {
		return nil, err
	}
	ts := make([]int32, n)
	for i := range ts {
		if ts[i], err = decodeToken(d); err != nil {
			return nil, err
		}
	}
	return ts, nil
}

// decodeToken reads a token id, or a pair of them: SGLang's EAGLE bigram
// pages list (token, next token) per position, whose first is the
// position's token.
func decodeToken(d *decoder) (int32, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	if !msgpcode.IsFixedArray(c) {
		t, err := d.DecodeInt64()
		return int32(t), err
	}
	n, err := d.arrayLen()
	if err != nil || n == 0 {
		return 0, cmp.Or(err, errors.New("an empty token pair"))
	}
	t, err := d.DecodeInt64()
	for range n - 1 {
		if err == nil {
			err = d.Skip()
		}
	}
	return int32(t), err
}

// Encode appends b to dst in format f, as vLLM's msgspec encoder writes it:
// ints in their smallest form, ts as a float64, the tag first, fields in
// declaration order, trailing defaults (extra_keys, group_idx and later)
// omitted; hashes as ints.
func Encode(dst []byte, b Batch, f Format) []byte {
	buf := bytes.NewBuffer(dst)
	e := msgpack.NewEncoder(buf)
	e.UseCompactInts(true)
	// Writes to a bytes.Buffer cannot fail; the encoder's errors are its
	// writer's.
	n := 2
	if b.HasDPRank {
		n = 3
	}
	if f != FormatMap {
		_ = e.EncodeArrayLen(n)
	} else {
		_ = e.EncodeMapLen(n)
		_ = e.EncodeString("ts")
	}
	_ = e.EncodeFloat64(b.TS)
	if f == FormatMap {
		_ = e.EncodeString("events")
	}
	_ = e.EncodeArrayLen(len(b.Events))
	for i := range b.Events {
		encodeEvent(e, &b.Events[i], f)
	}
	if b.HasDPRank {
		if f == FormatMap {
			_ = e.EncodeString("data_parallel_rank")
		}
		_ = e.EncodeInt(int64(b.DPRank))
	}
	return buf.Bytes()
}

func encodeEvent(e *msgpack.Encoder, ev *Event, f Format) {
	var fields []string
	switch {
	case ev.Kind == BlockStored && f == FormatSGLang:
		fields = storedFields[:5] // through lora_id
	case ev.Kind == BlockStored:
		fields = storedFields[:7] // through lora_name
	case ev.Kind == BlockRemoved && f == FormatSGLang:
		fields = removedFields[:1]
	case ev.Kind == BlockRemoved:
		fields = removedFields[:2] // through medium
	}
	if f != FormatMap {
		_ = e.EncodeArrayLen(1 + len(fields))
	} else {
		_ = e.EncodeMapLen(1 + len(fields))
		_ = e.EncodeString("type")
	}
	_ = e.EncodeString(ev.Kind.String())
	for _, name := range fields {
		if f == FormatMap {
			_ = e.EncodeString(name)
		}
		encodeEventField(e, ev, name, f == FormatSGLang)
	}
}

// encodeEventField writes one field; signed writes hashes as int64s, as
// SGLang's hash_str_to_int64 gives them.
func encodeEventField(e *msgpack.Encoder, ev *Event, name string, signed bool) {
	hash := func(h uint64) {
		if signed {
			_ = e.EncodeInt(int64(h))
		} else {
			_ = e.EncodeUint(h)
		}
	}
	optInt := func(n int) {
		if n == 0 {
			_ = e.EncodeNil()
		} else {
			_ = e.EncodeInt(int64(n))
		}
	}
	switch name {
	case "block_hashes":
		_ = e.EncodeArrayLen(len(ev.Hashes))
		for _, h := range ev.Hashes {
			hash(h)
		}
	case "parent_block_hash":
		if ev.HasParent {
			hash(ev.Parent)
		} else {
			_ = e.EncodeNil()
		}
	case "token_ids":
		_ = e.EncodeArrayLen(len(ev.Tokens))
		for _, t := range ev.Tokens {
			_ = e.EncodeInt(int64(t))
		}
	case "block_size":
		_ = e.EncodeInt(int64(ev.BlockSize))
	case "lora_id":
		optInt(ev.LoRAID)
	case "lora_name":
		if ev.LoRAName == "" {
			_ = e.EncodeNil()
		} else {
			_ = e.EncodeString(ev.LoRAName)
		}
	case "medium":
		_ = e.EncodeString(cmp.Or(ev.Medium, MediumGPU))
	}
}
