;;; acp.el --- Stand-in for acp.el in magent-store's tests  -*- lexical-binding: t; -*-

;;; Commentary:

;; magent's ACP module (required by its agent-shell module) requires
;; acp.el when it loads.  acp.el cannot be installed on the test machines
;; (it is neither a Debian package nor on PyPI), and the code our tests
;; drive (magent's list of its agent-shell buffers and its test of one)
;; never calls it: magent calls acp.el only when it makes a client.  This
;; empty feature lets magent's agent-shell module load; the tests put it
;; on `load-path' only when no real acp.el is installed.

;;; Code:

(provide 'acp)
;;; acp.el ends here
