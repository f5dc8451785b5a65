// Command coredns is CoreDNS's own main (coremain with its default plugins).
package main

import (
	_ "github.com/coredns/coredns/core/plugin"

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
