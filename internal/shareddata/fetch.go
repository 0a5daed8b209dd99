package shareddata

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
)

// File is one public data file: where it goes in a data directory, where it
// comes from (a raw.githubusercontent.com URL of a fixed commit, so the bytes
// never change) and their SHA-256.
type File struct {
	// Name is the path in the data directory, with slashes.
	Name string
	// URL is the upstream file at a pinned commit.
	URL string
	// SHA256 is the hex SHA-256 of the file's bytes.
	SHA256 string
	// Size is the file's length in bytes.
	Size int64
}

// The upstream commits, as docs/data.md cites them.
const (
	mooncakeRaw = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/"
	azureRaw    = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/b469a113cedca53ddc3bdea71a143dc4b7d8700c/"
	fastchatRaw = "https://raw.githubusercontent.com/lm-sys/FastChat/0e6d3e4beaab66f4d3f93db72541a4abab8af28d/"
)

// Files lists every file `kvroute data fetch` downloads, the licenses with
// the data. The checksums are those of the files CI keeps in ../shared/data
// (a test compares them).
var Files = []File{
	{"mooncake/conversation_trace.jsonl", mooncakeRaw + "FAST25-release/traces/conversation_trace.jsonl",
		"b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 3029533},
	{"mooncake/UPSTREAM-README.md", mooncakeRaw + "FAST25-release/README.md",
		"720b7571cfdfbc12555fd2bee9e9ba5479dffc7e355a1c5b049035388e3761d7", 3107},
	{"mooncake/LICENSE-APACHE", mooncakeRaw + "LICENSE-APACHE",
		"58d1e17ffe5109a7ae296caafcadfdbe6a7d176f0bc4ab01e12a689b0499d8bd", 11357},
	{"azure/AzureLLMInferenceTrace_code.csv", azureRaw + "data/AzureLLMInferenceTrace_code.csv",
		"54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6", 320117},
	{"azure/AzureLLMInferenceTrace_conv.csv", azureRaw + "data/AzureLLMInferenceTrace_conv.csv",
		"2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8", 719188},
	{"azure/LICENSE", azureRaw + "LICENSE",
		"9bbc1ea9fe5c96df01b311a2ac864d5b18fc87b9948bfd14770e4b44db755ee9", 18653},
	{"chat/mt_bench_question.jsonl", fastchatRaw + "fastchat/llm_judge/data/mt_bench/question.jsonl",
		"119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7", 48929},
	{"chat/LICENSE-APACHE", fastchatRaw + "LICENSE",
		"c71d239df91726fc519c6eb72d318ec65820627232b2f796219e87dcf35d0ab4", 11357},
}

// ErrChecksum means a downloaded file's bytes are not the pinned ones.
var ErrChecksum = errors.New("checksum mismatch")

// maxFileBytes bounds a download, far above the largest file (3 MB), so a
// wrong URL cannot fill the disk.
const maxFileBytes = 64 << 20

// Fetch downloads each of files into dir (creating it), checking every
// file's SHA-256 before it takes its place; files already there with the
// right checksum are kept. It logs a line per file to log and stops at the
// first failure. client nil is http.DefaultClient.
func Fetch(ctx context.Context, client *http.Client, dir string, files []File, log io.Writer) error {
	if client == nil {
		client = http.DefaultClient
	}
	for _, f := range files {
		dst := filepath.Join(dir, filepath.FromSlash(f.Name))
		if sum, err := fileSHA256(dst); err == nil && sum == f.SHA256 {
			fmt.Fprintf(log, "have    %s\n", dst)
			continue
		}
		if err := fetchOne(ctx, client, f, dst); err != nil {
			return fmt.Errorf("%s: %w", f.Name, err)
		}
		fmt.Fprintf(log, "fetched %s (%d bytes, sha256 ok)\n", dst, f.Size)
	}
	return nil
}

// fetchOne downloads f to a temporary file beside dst and renames it to dst
// once its checksum is right, so dst is never a partial or wrong file.
func fetchOne(ctx context.Context, client *http.Client, f File, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.URL, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", f.URL, resp.Status)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".fetch-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(tmp, h), io.LimitReader(resp.Body, maxFileBytes))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("GET %s: %w", f.URL, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return fmt.Errorf("%w: GET %s gave sha256 %s, want %s", ErrChecksum, f.URL, got, f.SHA256)
	}
	return os.Rename(tmp.Name(), dst)
}

// fileSHA256 returns the hex SHA-256 of the file at path.
func fileSHA256(path string) (string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Status is where one of Files was found, if anywhere.
type Status struct {
	File
	// Path is where it is; empty when missing.
	Path string
	// OK reports whether the file there has the pinned checksum.
	OK bool
}

// Check looks for each of Files in Dirs and checks its checksum.
func Check() []Status {
	out := make([]Status, 0, len(Files))
	for _, f := range Files {
		st := Status{File: f}
		if p, err := Path(f.Name); err == nil {
			st.Path = p
			sum, err := fileSHA256(p)
			st.OK = err == nil && sum == f.SHA256
		}
		out = append(out, st)
	}
	return out
}
