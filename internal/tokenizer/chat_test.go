package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

func TestEncodeChat(t *testing.T) {
	hdr := func(role string) []int32 {
		return slices.Concat([]int32{StartHeader}, Encode(nil, role), []int32{EndHeader}, Encode(nil, "\n\n"))
	}
	tests := []struct {
		name   string
		msgs   []Message
		genPro bool
		want   []int32
	}{
		{name: "empty", want: []int32{BOS}},
		{name: "empty with prompt", genPro: true, want: slices.Concat([]int32{BOS}, hdr("assistant"))},
		{
			name: "system and user",
			msgs: []Message{{"system", "Be brief."}, {"user", "Hi there"}},
			want: slices.Concat(
				[]int32{BOS},
				hdr("system"), Encode(nil, "Be brief."), []int32{EOT},
				hdr("user"), Encode(nil, "Hi there"), []int32{EOT},
			),
		},
		{
			name:   "user with prompt",
			msgs:   []Message{{"user", "Hi"}},
			genPro: true,
			want:   slices.Concat([]int32{BOS}, hdr("user"), Encode(nil, "Hi"), []int32{EOT}, hdr("assistant")),
		},
		{
			// A message ending in a space followed by one starting with a
			// word must not merge into " word": segments are encoded apart.
			name: "no merging across messages",
			msgs: []Message{{"user", "a "}, {"user", "b"}},
			want: slices.Concat(
				[]int32{BOS},
				hdr("user"), Encode(nil, "a "), []int32{EOT},
				hdr("user"), Encode(nil, "b"), []int32{EOT},
			),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := EncodeChat(nil, tt.msgs, tt.genPro)
			if !slices.Equal(got, tt.want) {
				t.Errorf("EncodeChat = %v, want %v", got, tt.want)
			}
			if n := CountChat(tt.msgs, tt.genPro); n != len(tt.want) {
				t.Errorf("CountChat = %d, want %d", n, len(tt.want))
			}
			if got := EncodeChat([]int32{1, 2}, tt.msgs, tt.genPro); !slices.Equal(got, slices.Concat([]int32{1, 2}, tt.want)) {
				t.Errorf("EncodeChat with non-empty dst = %v, want 1 2 then %v", got, tt.want)
			}
		})
	}
}

// TestChatTurnProperty checks what prefix caching across turns depends on:
// turn N+1's prompt begins with turn N's prompt, the reply and EOT.
func TestChatTurnProperty(t *testing.T) {
	tests := []struct {
		name    string
		system  string
		users   []string
		replies []string // "" means use Generate
	}{
		{
			name:    "plain",
			system:  "You are a helpful assistant.",
			users:   []string{"What is the capital of France?", "And of Germany?", "Thanks!"},
			replies: []string{"The capital of France is Paris.", "Berlin.", "You're welcome."},
		},
		{
			name:    "awkward boundaries",
			users:   []string{"ends with space ", "\n\nstarts with newlines", "12", "34"},
			replies: []string{" starts with space", "ends with newline\n", "56", ""},
		},
		{
			name:    "generated replies",
			system:  "Answer at length.",
			users:   []string{prose[:200], prose[200:500], prose[500:900], prose[900:1000], "ok"},
			replies: []string{"", "", "", "", ""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var msgs []Message
			if tt.system != "" {
				msgs = append(msgs, Message{"system", tt.system})
			}
			for turn, user := range tt.users {
				msgs = append(msgs, Message{"user", user})
				prompt := EncodeChat(nil, msgs, true)

				reply := tt.replies[turn]
				var replyIDs []int32
				if reply == "" {
					var ps []string
					replyIDs, ps = Generate(uint64(turn), 50+turn*37)
					reply = strings.Join(ps, "")
				} else {
					replyIDs = Encode(nil, reply)
				}
				msgs = append(msgs, Message{"assistant", reply})

				want := slices.Concat(prompt, replyIDs, []int32{EOT})
				for _, next := range []bool{false, true} {
					got := EncodeChat(nil, msgs, next)
					if !slices.Equal(got[:min(len(got), len(want))], want) {
						t.Fatalf("turn %d (generation prompt %v): next prompt does not start with prompt+reply+EOT", turn, next)
					}
				}
				// With the next user message the prompt still extends it.
				withNext := append(slices.Clip(msgs), Message{"user", "next"})
				if got := EncodeChat(nil, withNext, true); !slices.Equal(got[:len(want)], want) {
					t.Fatalf("turn %d: prompt with the next user message does not extend the previous one", turn)
				}
				if n := CountChat(msgs, true); n != len(EncodeChat(nil, msgs, true)) {
					t.Fatalf("turn %d: CountChat = %d, want %d", turn, n, len(EncodeChat(nil, msgs, true)))
				}
			}
		})
	}
}

func TestEncodeChatDoesNotAllocate(t *testing.T) {
	msgs := []Message{{"system", "Be brief."}, {"user", prose}, {"assistant", prose[:300]}, {"user", "More."}}
	dst := make([]int32, 0, 2*len(prose))
	allocs := testing.AllocsPerRun(20, func() {
		dst = EncodeChat(dst[:0], msgs, true)
	})
	if allocs != 0 {
		t.Errorf("EncodeChat into a large enough dst allocates %v times per run", allocs)
	}
	allocs = testing.AllocsPerRun(20, func() {
		sinkInt = CountChat(msgs, true)
	})
	if allocs != 0 {
		t.Errorf("CountChat allocates %v times per run", allocs)
	}
}
