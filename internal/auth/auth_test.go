package auth

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	b := NewBucket(60) // one a second, 60 at most
	tests := []struct {
		name     string
		at       time.Duration
		n        int
		wantOK   bool
		wantWait time.Duration
	}{
		{"full at start", 0, 60, true, 0},
		{"empty", 0, 1, false, time.Second},
		{"refilled a little", 2 * time.Second, 3, false, time.Second},
		{"refilled enough", 3 * time.Second, 3, true, 0},
		{"clock steps back: no refill", 1 * time.Second, 1, false, time.Second},
		{"refill is capped", time.Hour, 60, true, 0},
		{"larger than the bucket", time.Hour, 61, false, -1},
	}
	for _, tt := range tests {
		ok, wait := b.Take(t0.Add(tt.at), tt.n)
		if ok != tt.wantOK || wait != tt.wantWait {
			t.Errorf("%s: take(%d) = %v, %v; want %v, %v", tt.name, tt.n, ok, wait, tt.wantOK, tt.wantWait)
		}
	}
}

func TestParseAPIKeys(t *testing.T) {
	t.Setenv("KVROUTE_TEST_CLIENT_KEY", "from-env")
	tests := []struct {
		name, yaml string
		want       []APIKey
		wantErr    string
	}{
		{"full", "- {name: a, key: ka, priority: 2, rpm: 10, tpm: 1000}\n- {name: b, key_env: KVROUTE_TEST_CLIENT_KEY}\n",
			[]APIKey{{Key: "ka", Name: "a", Priority: 2, RPM: 10, TPM: 1000}, {Key: "from-env", Name: "b"}}, ""},
		{"empty", "", []APIKey{}, ""},
		{"unknown field", "- {name: a, key: k, rps: 1}\n", nil, "field rps not found"},
		{"no name", "- {key: k}\n", nil, "no name"},
		{"no key", "- {name: a}\n", nil, "empty key"},
		{"both", "- {name: a, key: k, key_env: KVROUTE_TEST_CLIENT_KEY}\n", nil, "not both"},
		{"unset env", "- {name: a, key_env: KVROUTE_TEST_UNSET}\n", nil, "unset or empty"},
		{"duplicate name", "- {name: a, key: k1}\n- {name: a, key: k2}\n", nil, "used twice"},
		{"duplicate key", "- {name: a, key: k}\n- {name: b, key: k}\n", nil, "given twice"},
		{"negative", "- {name: a, key: k, rpm: -1}\n", nil, "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys, err := parseAPIKeys([]byte(tt.yaml))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "k1") || strings.Contains(err.Error(), "from-env") {
					t.Errorf("error shows a key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(keys, tt.want) {
				t.Errorf("keys %+v, want %+v", keys, tt.want)
			}
		})
	}
}
