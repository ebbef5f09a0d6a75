;;; gptel.el --- Stand-in for gptel in magent-store's tests  -*- lexical-binding: t; -*-

;;; Commentary:

;; magent requires gptel when its modules load.  gptel cannot be installed
;; on the test machines (it is neither a Debian package nor on PyPI), and
;; the code our tests drive (magent's ledger, sessions and session loader)
;; never calls it.  This feature lets upstream magent load; it is on
;; `load-path' only when no real gptel is installed.  magent's tool modules
;; build their tool list with `gptel-make-tool' as they load, hence the
;; record below, with gptel's own slot names.

;;; Code:

(require 'cl-lib)

(cl-defstruct (gptel-tool (:constructor gptel-make-tool))
  "A gptel tool, as magent's modules build them at load time."
  function name description args async category confirm include)

(provide 'gptel)
;;; gptel.el ends here
