;;; wire-text.el --- What looking for bytes costs each message  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Every message the shim prints is searched once for the octal escapes
;; `prin1' writes for bytes (a unibyte string, or raw bytes), so that they
;; reach the backend as text.  This prints typical batches and times that
;; search next to the `prin1' it follows, byte-compiled, medians of 7
;; (for bytes, the search also turns them into text).
;;
;;   emacs --batch -Q -L elisp -l bench/elisp/wire-text.el
;;   <Emacs 30 root>/run emacs --batch -Q -L elisp -l bench/elisp/wire-text.el

;;; Code:

(require 'magent-store)

(dolist (f '(magent-store-print--unescape-bytes magent-store-print--decode-octal))
  (byte-compile f))

(defun wire-text--median-us (n thunk)
  "Median of 7 runs of N calls of THUNK, in microseconds per call."
  (let (runs)
    (dotimes (_ 7)
      (garbage-collect)
      (let ((start (float-time)))
        (dotimes (_ n) (funcall thunk))
        (push (/ (* 1e6 (- (float-time) start)) n) runs)))
    (nth 3 (sort runs #'<))))

(defun wire-text--row (label sexp)
  "Print the cost of printing SEXP, alone and followed by the search, as LABEL."
  (with-temp-buffer
    (buffer-disable-undo)
    (let* ((print-escape-newlines nil)
           (print (wire-text--median-us
                   2000 (lambda () (erase-buffer) (prin1 sexp (current-buffer)))))
           (both (wire-text--median-us
                  2000 (lambda () (erase-buffer) (prin1 sexp (current-buffer))
                         (magent-store-print--unescape-bytes (point-min))))))
      (message "%-30s %5d chars  prin1 %6.1f us  + search %5.1f us (%+4.0f%%)"
               label (buffer-size) print (- both print)
               (* 100 (/ (- both print) print))))))

(let ((prose (make-list 40 (list "item-1" "a streamed chunk of text, é 漢字" nil
                                 1764400000000.0)))
      (code (make-list 40 (list "item-1" "(format \"%s\\n\" (concat \"a\" b))"
                                nil 1764400000000.0)))
      (events (make-list 5 (magent-store-json-encode
                            '((type . "item-completed")
                              (payload . ((content . "\"quoted\" \\ é"))))))))
  (message "Emacs %s" emacs-version)
  (wire-text--row "40 chunks of prose" prose)
  (wire-text--row "40 chunks of code (\\ and \")" code)
  (wire-text--row "5 events (JSON text)" events)
  (wire-text--row "40 chunks of UTF-8 bytes"
                  (make-list 40 (list "item-1" (encode-coding-string "é 漢字" 'utf-8)
                                      nil 1764400000000.0))))

;;; wire-text.el ends here
