package engine

import (
	"testing"
)

// TestRemoteTokens checks a disaggregated decode: the prompt's KV pulled
// from a prefill server counts as cached, only its last token is computed,
// the pulled blocks become shareable here, and the prefix cache's hit
// counters see local hits alone.
func TestRemoteTokens(t *testing.T) {
	p := testProfile(t, 4096, 8192, 64)
	local, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	prompt := seq(0, 8000)
	whole := newReq(1, p.BlockSize, prompt, 4)
	mustAdd(t, local, 0, whole)
	drain(t, local, 0)

	remote, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	r := newReq(2, p.BlockSize, prompt, 4)
	r.RemoteTokens = len(prompt) // more than may be pulled: the last token is computed here
	mustAdd(t, remote, 0, r)
	res := remote.Step(0)
	if res.PrefillTokens != 1 || r.Output != 1 {
		t.Fatalf("first step computed %d prompt tokens and made %d outputs, want 1 and 1", res.PrefillTokens, r.Output)
	}
	if r.CachedTokens != len(prompt)-1 {
		t.Errorf("CachedTokens %d, want %d", r.CachedTokens, len(prompt)-1)
	}
	drain(t, remote, res.End)
	if r.FirstToken >= whole.FirstToken/4 {
		t.Errorf("remote TTFT %v, not well under the local prefill's %v", r.FirstToken, whole.FirstToken)
	}
	if st := remote.Stats(); st.PrefixHits != 0 || st.PrefixQueries != int64(len(prompt)) {
		t.Errorf("prefix stats %d hits of %d queries, want 0 of %d", st.PrefixHits, st.PrefixQueries, len(prompt))
	}
	// The pulled blocks are cached: the same prompt again hits them locally.
	again := newReq(3, p.BlockSize, prompt, 4)
	mustAdd(t, remote, remote.Step(r.Finish).End, again)
	drain(t, remote, r.Finish)
	if want := (len(prompt) - 1) / p.BlockSize * p.BlockSize; again.CachedTokens != want {
		t.Errorf("second request cached %d tokens, want %d", again.CachedTokens, want)
	}
}
