//go:build !unix

package proxy

import (
	"errors"
	"syscall"
)

// canPushSocket: elsewhere a stream is read, not pushed.
const canPushSocket = false

func (b *leanBody) pushSocket(syscall.RawConn, *chunkDecoder, byteSink) error {
	return errors.ErrUnsupported
}

func (c *leanConn) initPush() {}
